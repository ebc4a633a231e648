"""Snappy and deflate on a connection, after IDENTIFY negotiated them (docs/protocol.md §2.1).

Both directions of the stream are compressed with one long-lived codec each, as go-nsq and
Go nsqd stream them: snappy's framing format (python-snappy's stream codec: a stream
identifier chunk first, then compressed chunks with masked CRC-32C) or raw DEFLATE (no zlib
header) sync-flushed after every send so the peer can decode each batch at once.
"""

import zlib

import trio


class PrefixedStream(trio.abc.HalfCloseableStream):
    """A stream that first returns bytes already read from under it (pipelined data that
    arrived with the IDENTIFY which switched the protocol)."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


class CompressedStream(trio.abc.HalfCloseableStream):
    def __init__(self, stream: trio.abc.HalfCloseableStream, compress, decompress) -> None:
        self.stream = stream
        self._compress = compress
        self._decompress = decompress

    @classmethod
    def snappy(cls, stream: trio.abc.HalfCloseableStream) -> "CompressedStream":
        # Imported on the first snappy connection: python-snappy's codec (cramjam) is 1.7 MiB
        # resident that an nsqd whose clients never ask for it does not carry.
        import snappy

        compressor = snappy.StreamCompressor()
        decompressor = snappy.StreamDecompressor()
        return cls(stream, compressor.add_chunk, decompressor.decompress)

    @classmethod
    def deflate(cls, stream: trio.abc.HalfCloseableStream, level: int) -> "CompressedStream":
        compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        decompressor = zlib.decompressobj(-zlib.MAX_WBITS)

        def compress(data: bytes) -> bytes:
            return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

        return cls(stream, compress, decompressor.decompress)

    async def receive_some(self, max_bytes=None) -> bytes:
        while True:
            data = await self.stream.receive_some(max_bytes)
            if not data:
                return b""
            try:
                plain = self._decompress(data)
            except Exception as error:  # corrupt input: the connection cannot go on
                raise trio.BrokenResourceError(f"bad compressed data: {error}") from error
            if plain:
                return plain

    async def send_all(self, data) -> None:
        await self.stream.send_all(self._compress(bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """Nothing more goes to the peer: every send is flushed as it goes, so this ends the
        writes of the stream under it."""
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()
