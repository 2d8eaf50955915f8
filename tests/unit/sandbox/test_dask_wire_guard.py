"""The guard's wire checks in a process that armed them (Dask's preload does, on import):
pickles from a peer that does not drive the process build plain values only, and an error a
peer sends is never unpickled (review 23c). Each case runs in a fresh interpreter: arming
patches Dask for the whole process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the distributed extra is not installed: "
                    "pip install 'choir[distributed]'")

PLANT = textwrap.dedent("""\
    import os, pathlib, sys
    from distributed.protocol import pickle as dask_pickle

    MARK = pathlib.Path(sys.argv[1])

    class Plant:
        def __reduce__(self):
            return (exec, (f"open({str(MARK)!r}, 'w').write('ran')",))

    payload = dask_pickle.dumps(Plant())
    """)


def _run(tmp_path: Path, body: str) -> tuple[str, bool]:
    mark = tmp_path / "ran"
    out = subprocess.run([sys.executable, "-c", PLANT + textwrap.dedent(body), str(mark)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout, mark.exists()


@pytest.fixture(scope="module")
def armed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], bool]:
    """One armed interpreter: a peer's error loaded, then pickles read from a worker peer."""
    out, ran = _run(tmp_path_factory.mktemp("armed"), """
        from choir.distributed import guard  # arms
        from distributed import core
        from distributed.protocol import pickle as dask_pickle

        typ, exc, tb = core.clean_exception(exception=payload, traceback=payload,
                                            exception_text="ValueError('boom')")
        print(type(exc).__name__, exc, tb)
        token = guard._REFUSING.set("worker")  # as during a read from a worker peer
        print(dask_pickle.loads(dask_pickle.dumps((bytes, b"snap", {"a": [1, 2.0]}))))
        try:
            dask_pickle.loads(payload)
        except guard.PickleRefused as exc:
            print("refused:", exc)
        guard._REFUSING.reset(token)
        from distributed.protocol import core as protocol_core
        from distributed.core import Status
        member = {"__Enum__": True, "__module__": "distributed.core", "__name__": "Status",
                  "name": "running"}
        system = {"__Enum__": True, "__module__": "distributed.utils", "__name__": "os",
                  "name": "system"}
        print(protocol_core.msgpack_decode_default(system).__name__)  # the driver's: as Dask
        token = guard._REFUSING.set("worker")
        print(protocol_core.msgpack_decode_default(member) is Status.running)
        try:
            protocol_core.msgpack_decode_default(system)
        except guard.PickleRefused as exc:
            print("refused:", exc)
        guard._REFUSING.reset(token)
        """)
    return out.splitlines(), ran


def test_an_error_a_peer_sends_is_never_unpickled(armed: tuple[list[str], bool]) -> None:
    """A peer's error reply (``status: uncaught-error``) carries pickled exception and
    traceback bytes, which ``clean_exception`` loaded after the read: a worker fetching
    from a hostile peer ran its code."""
    lines, ran = armed
    assert not ran
    assert lines[0] == "Exception ValueError('boom') None"


def test_the_control_unarmed_dask_runs_the_peers_code(tmp_path: Path) -> None:
    _, ran = _run(tmp_path, """
        from distributed import core
        core.clean_exception(exception=payload, exception_text="x")
        """)
    assert ran  # what the guard stops


def test_a_non_driver_peer_may_send_plain_values_only(armed: tuple[list[str], bool]) -> None:
    lines, ran = armed
    assert not ran
    assert lines[1] == "(<class 'bytes'>, b'snap', {'a': [1, 2.0]})"
    assert lines[2].startswith("refused: a worker peer sent a pickle of builtins.exec")


def test_the_coordinators_clients_handle_no_event(tmp_path: Path) -> None:
    """Review 24a: Dask's client unpickles a "warn" event's message; the coordinator's
    clients subscribe to no topic and handle no event, whatever the scheduler forwards."""
    out, ran = _run(tmp_path, """
        import asyncio
        from distributed import Client
        from choir.distributed.fanout import _no_events

        _no_events()

        class Started:  # what Dask's start leaves: a handler for each default topic
            _event_handlers = dict(Client._default_event_handlers)

        asyncio.run(Client._handle_event(Started(), "warn", {"message": payload}))
        print(sorted(Started._event_handlers))
        """)
    assert not ran
    assert out.strip() == "[]"


def test_a_non_driver_peer_names_enum_members_only(armed: tuple[list[str], bool]) -> None:
    """Review 24a's doubt: Dask's msgpack decoder resolves ``__Enum__`` as any attribute of
    a dask or distributed module (``os.system`` through ``distributed.utils``), for any peer,
    before any handler: placed in the scheduler's state, whatever it is."""
    lines, _ = armed
    assert lines[3:5] == ["system", "True"]
    assert lines[5].startswith("refused: a worker peer named 'distributed.utils'.'os'")


COORDINATOR = """
    from choir.distributed import fanout
    from distributed.protocol import core as protocol_core
    from distributed.protocol.serialize import Serialize

    def read(msg, room):  # as the coordinator's read of one message from its scheduler
        frames = protocol_core.dumps(msg)
        token = fanout._LEFT.set([room]) if ARMED else None
        try:
            return protocol_core.loads(frames)
        finally:
            if token is not None:
                fanout._LEFT.reset(token)
    """


def test_the_scheduler_forwards_no_object_a_worker_sent(tmp_path: Path) -> None:
    """Review 24b, critical: the scheduler keeps a worker's task error (and a result's
    type) unopened and forwards it to the client that wants the key, whose stream Dask
    reads with every serializer: a pickled "error" ran its code in the coordinator. The
    guard drops both fields unless they are plain bytes (a type's pickle is bytes, which
    Choir's client never loads)."""
    out, ran = _run(tmp_path, """
        from choir.distributed import guard
        from distributed.protocol.serialize import Serialize, Serialized, serialize

        got = []

        class Scheduler:
            handlers = {}
            stream_handlers = {
                "task-erred": lambda **msg: got.append(msg),
                "task-finished": lambda **msg: got.append(msg)}

            async def handle_stream(self, comm, extra=None):
                pass

        server = Scheduler()
        guard._streams(server)
        token = guard._STREAM.set({"worker": "tls://w0"})
        evil = Serialized(*serialize(Plant(), serializers=("pickle",)))
        server.stream_handlers["task-erred"](key="k", worker="tls://w0", stimulus_id="s",
                                             exception=evil, traceback=evil,
                                             exception_text="boom")
        server.stream_handlers["task-finished"](key="k", worker="tls://w0", stimulus_id="s",
                                                type=evil)
        server.stream_handlers["task-finished"](key="k", worker="tls://w0", stimulus_id="s",
                                                type=b"pickled-type")
        guard._STREAM.reset(token)
        print([(m.get("exception"), m.get("traceback"), m.get("exception_text"),
                m.get("type")) for m in got])
        """)
    assert not ran
    assert out.strip() == ("[(None, None, 'boom', None), (None, None, None, None), "
                           "(None, None, None, b'pickled-type')]")


def test_what_msgpack_builds_is_charged_to_the_read(tmp_path: Path) -> None:
    """Review 24b, F2: each empty map is one byte on the wire and about 64 in memory; an
    answer of 48 MiB of them grew the coordinator by 4 GiB within its byte bound."""
    out, ran = _run(tmp_path, "ARMED = True\n" + textwrap.dedent(COORDINATOR) + textwrap.dedent("""
        import msgpack
        from distributed.protocol.serialize import Serialized
        fanout._bound_reads()
        # an answer of Dask's msgpack serializer: 300 kB on the wire, ~20 MB built
        maps = {"pad": Serialized({"serializer": "msgpack"}, [msgpack.dumps(({},) * 300_000)])}
        for room in (1 << 26, 1 << 20):
            try:
                print("read", len(read(maps, room)["pad"]))
            except fanout.ReadRefused as exc:
                print("refused:", exc)
        """))
    lines = out.splitlines()
    assert lines[0] == "read 300000", out  # within a room that holds it: read as before
    assert lines[1].startswith("refused: a message from the cluster of more than"), out
