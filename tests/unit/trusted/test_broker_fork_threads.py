"""The broker is a fork of its caller, and a caller may have threads: a lock another thread
held at the fork stays held in the broker forever, and the broker's first use of it hangs
every request (seen: a test worker's main thread waiting on its signature for ten minutes,
its broker forked from a thread while another built a model, stuck in pydantic's rebuild
lock on the attestation body it checks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""\
    import sys, threading, time
    from pathlib import Path

    import pydantic.main

    from choir._core.canonical import canonical_json
    from choir.exceptions import SigningRefused
    from choir.trusted import signer
    from choir.trusted.checks import ATTESTATION_TYPE

    held = threading.Event()

    def build():  # another thread building a model (deferred) while the broker is forked
        with pydantic.main._rebuild_lock:
            held.set()
            time.sleep(1.0)

    threading.Thread(target=build).start()
    held.wait()
    client = signer(Path(sys.argv[1]))  # forks the broker: its model is not built yet
    try:
        client.sign(canonical_json({"type": ATTESTATION_TYPE, "seq": 1}))
    except SigningRefused as exc:
        print("refused:", str(exc)[:60])
    """)


def test_a_broker_forked_while_another_thread_builds_a_model_still_answers(
        tmp_path: Path) -> None:
    script = tmp_path / "fork.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "home")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and its broker
        proc.communicate()
        raise AssertionError("the broker never answered: it waits on a lock held at its "
                             "fork by a thread it does not have") from None
    assert proc.returncode == 0, err
    assert "not a valid attestation body" in out, out
