"""The codec fuzz target: V2 command parser, frame decoder, IDENTIFY's JSON decoding, MPUB body
parsing and the HTTP query parser, fed arbitrary bytes.

Run under atheris (coverage-guided, libFuzzer flags):

    python -m fuzz.codec_target -atheris_runs=1000000 [corpus_dir]

or without atheris, on seeded random and grammar-built inputs:

    python -m fuzz.codec_target --random 100000 --seed 1

Invariants checked for every input: the only exception is ProtocolError (QueryError for the
query parser); what the parser buffers never exceeds its bound; cutting the input into pieces
never changes the commands or the error; frames decode back to what was encoded.
"""

import argparse
import random
import struct
import sys

try:
    import atheris
except ImportError:  # the plain-random mode needs no atheris
    atheris = None

if atheris is not None and __name__ == "__main__" and "--random" not in sys.argv:
    # Coverage for our decoders only: instrumenting trio and the rest costs seconds of start-up.
    # Only when run as the fuzzer: a process that imports this module (the tests) keeps its
    # modules as they are.
    with atheris.instrument_imports(
        include=["nsqpy.common.command_parser", "nsqpy.common.frame", "nsqpy.common.goformat",
                 "nsqpy.common.names", "nsqpy.daemon.http_server", "nsqpy.nsqd.protocol_v2"]
    ):  # fmt: skip
        from nsqpy.common.command_parser import CommandParser, parse_mpub_body
        from nsqpy.common.errors import ProtocolError
        from nsqpy.common.frame import FrameDecoder, encode_frame
        from nsqpy.daemon.http_server import QueryError, parse_query
        from nsqpy.nsqd.identify import decode_identify
else:
    from nsqpy.common.command_parser import CommandParser, parse_mpub_body
    from nsqpy.common.errors import ProtocolError
    from nsqpy.common.frame import FrameDecoder, encode_frame
    from nsqpy.daemon.http_server import QueryError, parse_query
    from nsqpy.nsqd.identify import decode_identify

# Small limits, so that the fuzzer reaches "too big" as easily as "fits".
LIMITS = {"max_msg_size": 64, "max_body_size": 256, "max_line_length": 100}


def _parse(data: bytes, cuts: list[int], binary_ids: bool):
    parser = CommandParser(expect_magic=True, **LIMITS)
    parser.binary_ids = binary_ids
    commands = []
    edges = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    try:
        for start, end in zip(edges, edges[1:], strict=False):
            parser.receive_data(data[start:end])
            while (command := parser.next_command()) is not None:
                commands.append((command.name, command.args, command.body, command.messages))
                if command.name == b"SUB" and len(command.args) > 2:
                    parser.binary_ids = True
            assert parser.buffered <= parser.buffer_limit, (parser.buffered, parser.buffer_limit)
        parser.receive_eof()
    except ProtocolError as error:
        return commands, error.text
    return commands, None


def check(data: bytes) -> None:
    """One input through every decoder. Raises AssertionError (or anything unexpected)."""
    if not data:
        return
    selector, cut_seed, payload = data[0], data[1:2], data[2:]
    binary_ids = bool(selector & 1)
    cut_rng = random.Random(cut_seed)
    cuts = [cut_rng.randrange(len(payload) + 1) for _ in range(cut_rng.randrange(0, 8))]
    # The command parser, with and without the magic the input may or may not start with.
    whole = _parse(payload, [], binary_ids)
    pieces = _parse(payload, cuts, binary_ids)
    assert whole == pieces, (whole, pieces)
    with_magic = b"  V2" + payload
    assert _parse(with_magic, [], binary_ids) == _parse(
        with_magic, [c + 4 for c in cuts], binary_ids
    )

    # The client's frame decoder: arbitrary bytes, and frames it must give back unchanged.
    decoder = FrameDecoder(max_frame_size=1024)
    try:
        decoder.receive_data(payload)
    except ProtocolError:
        pass
    frame = encode_frame(selector % 3, payload[:100])
    frames = FrameDecoder().receive_data(frame)
    assert [(f.frame_type, f.data) for f in frames] == [(selector % 3, payload[:100])]

    # IDENTIFY's JSON (deep nesting once took a connection down with a RecursionError).
    try:
        decoded = decode_identify(payload)
    except ProtocolError as error:
        assert error.text == "E_BAD_BODY IDENTIFY failed to decode JSON body", error.text
    else:
        # Every text a client sets must be encodable: /metrics, /stats and the log show it
        # (a `\ud800` escape once made /metrics answer 500).
        for value in [*decoded.values(), *decoded.get("_extra", {}).values()]:
            if isinstance(value, str):
                value.encode("utf-8")

    # MPUB bodies, as TCP and as /mpub?binary=true read them.
    for exact in (True, False):
        try:
            messages = parse_mpub_body(payload, 64, 256, exact=exact)
        except ProtocolError:
            continue
        assert all(0 < len(m) <= 64 for m in messages)

    # The HTTP query parser.
    try:
        parse_query(payload.decode("latin-1"))
    except QueryError:
        pass


def TestOneInput(data: bytes) -> None:  # noqa: N802 - atheris's name
    check(data)


# -- without atheris ---------------------------------------------------------------------------


def _seed_inputs(rng: random.Random) -> list[bytes]:
    from fuzz.tcp_grammar import Grammar

    grammar = Grammar(rng)
    seeds = []
    for _ in range(50):
        session = grammar.session()
        seeds.append(bytes([rng.randrange(256), rng.randrange(256)]) + session.payload()[4:2000])
    seeds.append(b"\x00\x00IDENTIFY\n" + struct.pack(">i", 20001) + b"[" * 20001)
    seeds.append(b'\x00\x00{"client_id":"\\ud800","desired_tag":"\\udfff"}')
    return seeds


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        kind = rng.randrange(5)
        position = rng.randrange(len(data) + 1)
        if kind == 0 and data:
            data[min(position, len(data) - 1)] = rng.randrange(256)
        elif kind == 1:
            data[position:position] = rng.randbytes(rng.randrange(1, 8))
        elif kind == 2 and data:
            del data[position : position + rng.randrange(1, 8)]
        elif kind == 3:
            data[position:position] = struct.pack(">i", rng.choice([0, -1, 2**31 - 1, 65, 257]))
        else:
            data[position:position] = rng.choice([b"\n", b" ", b"PUB ", b"MPUB t\n", b"FIN "])
    return bytes(data)


def run_random(count: int, seed: int) -> int:
    """`count` inputs: a third plain random bytes, the rest mutations of grammar sessions."""
    rng = random.Random(seed)
    seeds = _seed_inputs(rng)
    for index in range(count):
        if index % 3 == 0:
            data = rng.randbytes(rng.randrange(0, 300))
        else:
            data = _mutate(rng, rng.choice(seeds))
        try:
            check(data)
        except Exception:
            print(f"codec_target: failing input (seed {seed}, #{index}): {data!r}", file=sys.stderr)
            raise
    return count


def main() -> None:
    if "--random" in sys.argv or atheris is None:
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--random", type=int, default=100_000, help="inputs to run")
        parser.add_argument("--seed", type=int, default=1)
        options = parser.parse_args()
        run_random(options.random, options.seed)
        print(f"codec_target: {options.random} inputs, seed {options.seed}: no failure")
        return
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
