# hashlib and zlib over 1 MiB of bytes: SHA-256, compress and decompress.
import hashlib
import zlib

DATA = bytes(range(256)) * 2048 + b"sandcell " * 20000


def bench():
    hashlib.sha256(DATA).hexdigest()
    zlib.decompress(zlib.compress(DATA, 6))
