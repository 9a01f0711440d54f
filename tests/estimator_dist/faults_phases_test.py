"""Every phase has a bound: real processes hung in session creation, or waiting for a peer.

A hang in session creation (induced on one task by `tests.task_models:hang_in_session_once`,
a hook blocking in `after_create_session`, after "Running local_init_op.") ends that attempt
with exit 157 within the stall timeout, and the launcher's restart finishes the job at exactly
--train_steps. A chief whose worker starts late names it, its address, the time waited and the
bound, at every interval, before the worker arrives.
"""

import json
import os
import random
import re
import time

import pytest

from estimator_dist.base import exit_codes
from estimator_dist.report.console import ConsoleFilter
from tests.procs import Background, local_tf_configs, measured, report, tasks

# No TensorFlow at import: this module also runs as the late-worker test's chief (at the end),
# where the package's flags must come before TensorFlow is imported.

pytestmark = pytest.mark.multiprocess

#: The stall timeout of the hung job: the bound of session creation and the first step.
STALL = 15


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_a_hang_in_session_creation_exits_157_and_the_restart_ends_at_the_last_step(
    tmp_path, data_dir, fault_seed
):
    import tensorflow as tf

    from tests.task_models import SESSION_HANG_ENV

    rng = random.Random(fault_seed)
    victim = rng.choice(["chief-0", "worker-0"])
    hang = rng.randint(3 * STALL, 6 * STALL)  # Far past the bound: only the watchdog ends it.
    steps = 100
    model_dir, marker = tmp_path / "run", tmp_path / "hung"
    args = [
        "--num_workers=2",
        "--noevaluator",
        "--max_restarts=2",
        "--grace_secs=1",
        "--timeout_secs=240",
        "--",
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        "--model_fn=tests.task_models:hang_in_session_once",
        "--input_fn=tests.task_inputs:example_sharded",
        f"--train_steps={steps}",
        "--save_checkpoints_steps=50",
        "--log_step_count_steps=10",
        f"--stall_timeout={STALL}",
    ]
    env = {SESSION_HANG_ENV: f"{victim}:{hang}:{marker}"}
    with Background("estimator_dist.launch", args, env=env) as launcher:
        failed = launcher.wait_for_line(
            r"^\[(\S+)\] estimator_dist: task (\S+) failed \(exit (\d+)\): (.*)", 120
        )
        detected = time.time() - os.path.getmtime(marker)  # The marker is written as it hangs.
        code = launcher.wait(timeout=200)
    output = launcher.output
    print(f"seed {fault_seed}: {victim} hung {hang} s in session creation")
    assert int(failed[3]) == exit_codes.SESSION_HUNG, report(
        f"the first failure was exit {failed[3]}, expected 157 (SESSION_HUNG)", output
    )
    assert re.match(
        r"(session creation \(restore or init_op, local_init_op, the hooks' after_create_session"
        r"\) did not end|the session was ready \d+ s ago, but the first step \(which meets every "
        rf"peer in its first collective\) did not end) within {STALL} s \(--stall_timeout\)",
        failed[4],
    ), report(f"the exit-157 line does not name the phase and bound: {failed[4]}", output)
    assert detected < STALL + 5, report(
        f"the hang was detected {detected:.1f} s after it began, expected < {STALL + 5}", output
    )
    assert code == 0, report(f"the launcher exited {code}, expected 0", output)
    restart = re.search(
        r"\[launcher\] restart after attempt 0: \S+ exited with code 157 \(SESSION_HUNG\).*; "
        r"resumed from checkpoint step (\d+), (\d+) step\(s\) lost",
        output,
    )
    assert restart, report("the launcher reported no restart after exit 157", output)
    assert "attempt 1 failed" not in output, report("attempt 1 failed too", output)
    resumed = re.search(r"training resumed ([\d.]+) s after the failure", output)
    assert resumed, report("the restarted job never trained", output)
    latest = tf.train.latest_checkpoint(str(model_dir))
    assert latest.endswith(f"model.ckpt-{steps}"), report(f"latest checkpoint {latest}", output)
    assert tf.train.load_checkpoint(latest).get_tensor("global_step") == steps
    assert int(restart[2]) == 0, report("steps were lost, though no step ran", output)
    measured(
        "session_hang",
        seed=fault_seed,
        victim=victim,
        bound_secs=STALL,
        detected_secs=f"{detected:.1f}",
        resumed_secs=resumed[1],
        resumed_from=restart[1],
        steps_lost=restart[2],
    )


@pytest.mark.timeout(240)
def test_a_chief_whose_worker_starts_late_names_it_at_each_interval_until_it_comes(
    tmp_path, data_dir
):
    # The chief runs this module as `estimator_dist.train` with a line every WAIT_SECS, not
    # 30 s (the schedule itself is unit-tested with a fake clock in rendezvous_test.py).
    configs = local_tf_configs(2)
    args = [
        f"--model_dir={tmp_path}",
        f"--data_dir={data_dir}",
        "--input_fn=tests.task_inputs:example_sharded",
        "--train_steps=20",
    ]
    waiting = (
        r"estimator_dist: task chief-0 waiting for worker-0 \((\S+)\) at the rendezvous for "
        r"(\d+) s of at most 600 s$"
    )
    with tasks({"chief-0": configs["chief-0"]}, args, module=__name__) as chief:
        lines = [chief["chief-0"].wait_for_line(waiting, 90) for _ in range(2)]
        with tasks({"worker-0": configs["worker-0"]}, args) as worker:
            chief["chief-0"].wait_for_line(r"Rendezvous: all 1 other task\(s\) agree", 120)
        output = {"chief-0": chief["chief-0"].output, "worker-0": worker["worker-0"].output}
    address = json.loads(configs["worker-0"])["cluster"]["worker"][0]
    assert [line[1] for line in lines] == [address, address], report(
        f"the lines name {[line[1] for line in lines]}, not worker-0's {address}", output
    )
    assert [int(line[2]) for line in lines] == [WAIT_SECS, 2 * WAIT_SECS], report(
        f"lines at {[line[2] for line in lines]} s, expected {WAIT_SECS} and {2 * WAIT_SECS}",
        output,
    )
    for line in lines:
        assert ConsoleFilter()(line.string) == line[0], report("the console hides it", output)
    assert not re.search(r"task worker-0 waiting for", output["worker-0"]), report(
        "worker-0 came last, and named someone missing", output
    )


#: Seconds between two waiting lines of the chief the late-worker test starts.
WAIT_SECS = 5

if __name__ == "__main__":
    # `python -m tests.estimator_dist.faults_phases_test ...`: estimator_dist.train, saying
    # whom it waits for every WAIT_SECS.
    from estimator_dist import train
    from estimator_dist.guards import rendezvous

    rendezvous.WAIT_NOTICE_SECS = WAIT_SECS
    train.run()
