"""Exit codes: which ones a restart policy retries, and that they stay distinct."""

import pytest

from estimator_dist.base import errors, exit_codes
from estimator_dist.base.exit_codes import is_retryable

NAMED_CODES = {
    name: value
    for name, value in vars(exit_codes).items()
    if name.isupper() and isinstance(value, int) and not isinstance(value, bool)
}


@pytest.mark.parametrize(
    "code, retryable",
    [
        (-1, True),
        (-9, True),
        (-15, True),
        (0, False),
        (1, False),
        (2, False),
        (4, False),
        (5, False),
        (6, False),
        (7, False),
        (8, False),
        (9, False),
        (127, False),
        (128, True),
        (150, True),
        (151, True),
        (152, True),
        (153, True),
        (154, True),
        (255, True),
    ],
)
def test_is_retryable(code, retryable):
    assert is_retryable(code) is retryable


def test_named_codes_are_the_documented_ones():
    assert NAMED_CODES == {
        "OK": 0,
        "FAILURE": 1,
        "USAGE": 2,
        "BAD_DATA": 3,
        "CLUSTER_MISMATCH": 4,
        "USER_CODE": 5,
        "INPUT_EXHAUSTED": 6,
        "COLLECTIVE_MISMATCH": 7,
        "EVAL_UNENDING": 8,
        "MODEL_DIR_UNWRITABLE": 9,
        "PEER_FAILURE": 150,
        "CLUSTER_TIMEOUT": 151,
        "STALLED": 152,
        "SESSION_RECOVERY": 153,
        "PORT_IN_USE": 154,
        "PREEMPTED": 155,
        "PEER_UNRESPONSIVE": 156,
        "SESSION_HUNG": 157,
        "FINAL_PHASE_HUNG": 158,
        "CHECKPOINT_GONE": 159,
        "STORAGE_UNREACHABLE": 160,
    }


@pytest.mark.parametrize("name", sorted(NAMED_CODES))
def test_named_code_is_retryable_exactly_when_128_or_more(name):
    code = NAMED_CODES[name]
    assert 0 <= code <= 255, f"{name}={code} is not a process exit code"
    assert is_retryable(code) is (code >= 128), name


@pytest.mark.parametrize("name", sorted(n for n, c in NAMED_CODES.items() if 0 < c < 128))
def test_named_failure_code_below_128_is_not_retryable(name):
    assert not is_retryable(NAMED_CODES[name])


def test_ok_is_zero_and_not_retryable():
    assert exit_codes.OK == 0
    assert not is_retryable(exit_codes.OK)


def test_named_codes_are_unique():
    values = list(NAMED_CODES.values())
    assert len(values) == len(set(values)), NAMED_CODES


def test_every_named_code_is_in_the_module_docstring_table():
    for name, code in NAMED_CODES.items():
        assert f"| {code} | {name} |" in exit_codes.__doc__, name


@pytest.mark.parametrize(
    "error, code",
    [
        (errors.Error, exit_codes.FAILURE),
        (errors.UsageError, exit_codes.USAGE),
        (errors.ClusterConfigError, exit_codes.USAGE),
        (errors.DatasetNotFoundError, exit_codes.USAGE),
        (errors.RegistryError, exit_codes.USAGE),
        (errors.ClusterMismatchError, exit_codes.CLUSTER_MISMATCH),
        (errors.PeerFailureError, exit_codes.PEER_FAILURE),
        (errors.ClusterTimeoutError, exit_codes.CLUSTER_TIMEOUT),
        (errors.PortInUseError, exit_codes.PORT_IN_USE),
        (errors.UserCodeError, exit_codes.USER_CODE),
        (errors.CollectiveMismatchError, exit_codes.COLLECTIVE_MISMATCH),
        (errors.ModelDirUnwritableError, exit_codes.MODEL_DIR_UNWRITABLE),
    ],
)
def test_error_exit_codes(error, code):
    assert error.exit_code == code
    assert issubclass(error, errors.Error)


def test_failure_prefix_names_the_role():
    assert exit_codes.FAILURE_PREFIX.format(role="worker-1") == (
        "estimator_dist: task worker-1 failed"
    )
