"""``kvscope run --pd 1P1D`` when its decode instance fails mid-run (real processes, a real signal, a tiny model,
bounded in time): a SIGKILL or a SIGSTOP after two requests finished. The requests it held and those that come
later fail, naming it; those that finished keep their true outputs; the summary counts the errors; the CLI exits
1 saying so on stderr; the files are written and load back. One Ctrl-C ends a run whose decode instance is
stopped, with its files."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import kvscope

OUTPUT_LEN = 6  # synthetic requests ignore EOS: every finished one has exactly this many tokens

# the run, in its own interpreter (signals; a stuck instance cannot hang pytest): after the decode instance has
# handed back two finished requests, the fault hits it from the router's own thread, at a known point
SCRIPT = textwrap.dedent(f"""
    import os, signal, sys, time
    from kvscope.cli.main import main
    from kvscope.pd.recorder import PDRecorder

    fault, out = sys.argv[1], sys.argv[2]
    publish, hit = PDRecorder.publish, []

    def publish_then_fault(self, instance, items):  # noqa
        publish(self, instance, items)
        finished = sum(1 for x in items if getattr(x, "kind", None) == "finished")
        hit.append(finished)
        if sum(hit) >= 2 and len(hit) < 10**6:
            hit.append(10**6)  # once
            pid = self.engine.instances["decode-0"].info["pid"]
            print(f"FAULT {{fault}} {{pid}} {{time.monotonic()}}", file=sys.stderr, flush=True)
            os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            if fault == "stop+int":
                os.kill(os.getpid(), signal.SIGINT)

    PDRecorder.publish = publish_then_fault
    sys.exit(main(["run", "--model", "tiny", "--pd", "1P1D", "--requests", "10", "--rate", "6",
                   "--prompt-len", "20-40", "--output-len", "{OUTPUT_LEN}", "--block-size", "8", "--out", out]))
""")


def run_with_fault(fault: str, tmp_path, timeout_s: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    """The run's process and the seconds from the fault to its exit (the decode instance is made sure gone)."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, fault, str(tmp_path / "run")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.monotonic()
    fault_at = re.search(r"FAULT \S+ (\d+) ([\d.]+)", err)  # after a progress bar's last line, maybe
    assert fault_at is not None, err
    try:  # a stopped instance left behind would never end
        os.kill(int(fault_at[1]), signal.SIGCONT)
        os.kill(int(fault_at[1]), signal.SIGKILL)
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), ended - float(fault_at[2])


def check_files(tmp_path, words: tuple[str, ...], num_requests: int = 10) -> None:
    for path in (tmp_path / "run.metrics.jsonl", tmp_path / "run.trace.json"):
        run = kvscope.load(path)
        req = run.requests
        failed, done = req[req.finish_reason == "error"], req[req.finish_reason == "length"]
        assert len(req) == num_requests and len(failed) and len(done) >= 2, req[["request_id", "finish_reason"]]
        assert req.finish_reason.isin(["error", "length", "abort"]).all()
        for error in failed.error:
            assert "decode-0" in error and any(w in error for w in words), error
        # finished requests keep what they got: the decode side's tokens, not the prefill side's one
        assert (done.num_output_tokens == OUTPUT_LEN).all(), done
        s = run.summary()
        assert s["errors"] == len(failed) and s["requests"] == num_requests
        assert s["output_tokens"] >= OUTPUT_LEN * len(done)
        assert not run.meta["pd"]["instances"][1]["alive"]


@pytest.mark.slow
def test_a_killed_decode_instance_fails_its_requests_and_the_run(tmp_path):
    proc, after = run_with_fault("kill", tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "requests failed" in proc.stderr and "decode-0" in proc.stderr
    check_files(tmp_path, ("died", "no live decode instance"))
    assert after < 60


@pytest.mark.slow
def test_a_stopped_decode_instance_and_one_ctrl_c_end_the_run_with_its_files(tmp_path):
    """SIGSTOP on the decode instance, then one SIGINT: the run ends within seconds (the router gives the stopped
    instance up after STOPPED_GRACE_S and kills it; Ctrl-C's aborts wait on nothing unbounded), files written."""
    proc, after = run_with_fault("stop+int", tmp_path)
    assert "SIGINT: stopping the run" in proc.stderr
    assert (tmp_path / "run.html").exists()
    assert after < 60
    run = kvscope.load(tmp_path / "run.metrics.jsonl")
    submitted = len(run.requests)  # Ctrl-C: the later ones never came
    if proc.returncode == 130:  # the stopped instance held no request when Ctrl-C came (timing): none failed
        assert "interrupted" in proc.stdout and (run.requests.finish_reason != "error").all(), proc.stderr
        return
    assert proc.returncode == 1 and "requests failed" in proc.stderr and "stopped" in proc.stderr, proc.stderr
    check_files(tmp_path, ("stopped", "no live decode instance"), submitted)
