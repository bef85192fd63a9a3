"""A PostgreSQL session that speaks the frontend/backend protocol itself, for what psql
cannot send: statements prepared at the protocol level (Parse, then Bind and Execute for
each execution, Close), as drivers and `pgbench -M prepared` send them. psql's PREPARE
and EXECUTE are SQL commands, which the server runs as utilities.

Trust authentication over the server's Unix socket only, text results, no parameters:
what the regression checks need.
"""

import socket
import struct


class Error(Exception):
    """An ErrorResponse: `sqlstate` and `message`."""

    def __init__(self, sqlstate, message):
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate, self.message = sqlstate, message


def _cstr(text):
    return text.encode() + b"\0"


class Session:
    """A connection to the server listening on `socket_dir`/.s.PGSQL.`port`, as `user`."""

    def __init__(self, socket_dir, port, user="postgres", database="postgres", timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(f"{socket_dir}/.s.PGSQL.{port}")
        self.buffer, self.error = b"", None
        body = struct.pack("!i", 196608) + _cstr("user") + _cstr(user) + \
            _cstr("database") + _cstr(database) + b"\0"
        try:
            self.sock.sendall(struct.pack("!i", 4 + len(body)) + body)
            self._until_ready()
        except BaseException:
            self.sock.close()
            raise

    def _send(self, *messages):
        self.sock.sendall(b"".join(struct.pack("!ci", kind, 4 + len(body)) + body
                                   for kind, body in messages))

    def _message(self):
        while True:
            if len(self.buffer) >= 5:
                kind, length = struct.unpack("!ci", self.buffer[:5])
                if len(self.buffer) >= 1 + length:
                    body = self.buffer[5:1 + length]
                    self.buffer = self.buffer[1 + length:]
                    return kind, body
            chunk = self.sock.recv(65536)
            if not chunk:
                raise self.error or ConnectionError("the server closed the connection")
            self.buffer += chunk

    def _until_ready(self):
        """Reads up to ReadyForQuery: the rows' text values; raises the first error (also
        when the server closes the connection after it: a FATAL)."""
        rows, self.error = [], None
        while True:
            kind, body = self._message()
            if kind == b"D":
                count, at, row = struct.unpack("!h", body[:2])[0], 2, []
                for _ in range(count):
                    (size,) = struct.unpack("!i", body[at:at + 4])
                    at += 4
                    row.append(None if size < 0 else body[at:at + size].decode())
                    at += max(size, 0)
                rows.append(row)
            elif kind == b"E" and self.error is None:
                fields = dict((f[:1], f[1:].decode()) for f in body.split(b"\0") if f)
                self.error = Error(fields.get(b"C"), fields.get(b"M"))
            elif kind == b"R" and struct.unpack("!i", body[:4])[0] != 0:
                raise Error("28000", "the server asked for a password; trust was expected")
            elif kind == b"Z":
                if self.error is not None:
                    raise self.error
                return rows

    def query(self, sql):
        """Runs `sql` (simple protocol); returns its rows."""
        self._send((b"Q", _cstr(sql)))
        return self._until_ready()

    def prepare(self, name, sql):
        """Prepares `sql` as statement `name` (Parse)."""
        self._send((b"P", _cstr(name) + _cstr(sql) + struct.pack("!h", 0)), (b"S", b""))
        self._until_ready()

    def execute(self, name, params=()):
        """Runs prepared statement `name` to completion (Bind, Execute) with `params`
        (strings, sent as text); returns its rows."""
        values = b"".join(struct.pack("!i", len(v)) + v for v in (p.encode() for p in params))
        bind = (_cstr("") + _cstr(name) + struct.pack("!hh", 0, len(params)) + values
                + struct.pack("!h", 0))
        self._send((b"B", bind), (b"E", _cstr("") + struct.pack("!i", 0)), (b"S", b""))
        return self._until_ready()

    def bind(self, portal, name):
        """Binds prepared statement `name`, without parameters, to portal `portal`."""
        bind = _cstr(portal) + _cstr(name) + struct.pack("!hhh", 0, 0, 0)
        self._send((b"B", bind), (b"S", b""))
        self._until_ready()

    def fetch(self, portal, rows):
        """Runs portal `portal` for at most `rows` rows (Execute); returns them."""
        self._send((b"E", _cstr(portal) + struct.pack("!i", rows)), (b"S", b""))
        return self._until_ready()

    def deallocate(self, name):
        """Closes prepared statement `name` (Close): its plans go."""
        self._send((b"C", b"S" + _cstr(name)), (b"S", b""))
        self._until_ready()

    def close(self):
        """Ends the session (Terminate), whether or not the server still listens."""
        try:
            self._send((b"X", b""))
        except OSError:
            pass
        self.sock.close()
