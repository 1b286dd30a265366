"""The trainer skeleton (rossjax/train/skeleton.py): when hooks run, the stopped run's last line
and its resume command, and Ctrl-C in the preemption guard (the first one a flag, a second one
the default action). The runs themselves: test_sft_loop, test_grpo, test_faults_runs."""

import os
import shlex
import signal

from rossjax.train import skeleton
from rossjax.train.checkpoint import PreemptionGuard


def _due(hook, total=6):
    return [d for d in range(1, total + 1) if hook.due(skeleton.StepInfo(d, total, {}))]


def test_hooks_run_every_n_steps_and_at_the_last_as_asked():
    f = lambda info: None
    assert _due(skeleton.Hook(f, every=4, last=True)) == [4, 6]    # metrics: also the last
    assert _due(skeleton.Hook(f, every=3, last=False)) == [3]      # eval: finish() does the last
    assert _due(skeleton.Hook(f, every=4)) == [4]                  # samples: every alone
    assert _due(skeleton.Hook(f, every=-1)) == [] and _due(skeleton.Hook(f, every=0, last=True)) == [6]


def test_the_stopped_line_names_the_step_and_a_command_that_resumes():
    out = {"step": 3, "total": 40, "stopped_by": "SIGINT"}
    argv = ["--config=configs/ross_sft.py:runlocal", "--workdir=/tmp/a b"]
    line = skeleton.stopped_message("train", "/tmp/a b", out, "loss 1.2345", argv)
    assert line.startswith("rossjax train: stopped early at step 3 of 40 (SIGINT; loss 1.2345)")
    assert shlex.split(line.split("Resume with: ")[1]) == ["rossjax", "train", *argv]
    # without the command line (the library's run()): the workdir's saved config
    assert skeleton.resume_command("grpo", "/w") == "rossjax grpo --config=/w/config.py --workdir=/w"
    assert skeleton.stop_code(out) == 130 and skeleton.stop_code({"stopped_by": "SIGTERM"}) == 0


def test_first_ctrl_c_is_a_stop_request_and_arms_a_second_to_end_the_process():
    before = signal.getsignal(signal.SIGINT)
    with PreemptionGuard("train") as g:
        os.kill(os.getpid(), signal.SIGINT)
        assert g.requested and g.signal_name == "SIGINT"
        # the next Ctrl-C is the kernel's default action: the process ends at once, unsaved
        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) == before


def test_workers_started_under_ctrl_c_blocked_never_see_a_terminals_ctrl_c():
    """A terminal's Ctrl-C reaches the whole process group; GRPO's reward workers start with
    SIGINT blocked (checkpoint.ctrl_c_blocked), so only the trainer acts on it."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from rossjax.train.checkpoint import ctrl_c_blocked

    def child_mask(blocked):
        with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
            if blocked:
                with ctrl_c_blocked():
                    fut = ex.submit(signal.pthread_sigmask, signal.SIG_BLOCK, [])
            else:
                fut = ex.submit(signal.pthread_sigmask, signal.SIG_BLOCK, [])
            return fut.result()

    assert signal.SIGINT in child_mask(True) and signal.SIGINT not in child_mask(False)
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # unblocked after


def test_ctrl_c_in_set_up_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    """Before the first step (data scan, model load) there is no step to finish: Ctrl-C stops
    with one line naming the command to rerun, not a traceback."""
    from rossjax import cli
    from rossjax.train.sft import trainer

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "prepare", interrupted)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [f"--config={root}/configs/ross_sft.py:runlocal", f"--config.data.train={tmp_path}/d",
            f"--workdir={tmp_path}/run"]
    assert cli.main(["train", *argv]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rossjax train: stopped by Ctrl-C outside a training step"), err
    assert err[-1].endswith(shlex.join(["rossjax", "train", *argv]))
