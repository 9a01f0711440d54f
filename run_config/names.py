"""Names of strategies and collective implementations (no TensorFlow import).

Kept apart so that command-line flags can list them without the seconds it
takes to import TensorFlow.
"""

MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
MIRRORED = "mirrored"
CENTRAL_STORAGE = "central_storage"
PARAMETER_SERVER = "parameter_server"
ONE_DEVICE = "one_device"
OFF = "off"

#: Strategy names `get_strategy` accepts, the default first.
STRATEGY_NAMES = (
    MULTI_WORKER_MIRRORED,
    MIRRORED,
    CENTRAL_STORAGE,
    PARAMETER_SERVER,
    ONE_DEVICE,
    OFF,
)
#: Strategies an evaluator or a single-process evaluation can use.
EVAL_STRATEGY_NAMES = (OFF, MIRRORED, ONE_DEVICE)
#: Collective implementations of MultiWorkerMirroredStrategy.
COMMUNICATIONS = ("AUTO", "RING", "NCCL")
#: Dtypes gradients can cross the network in (`--gradient_wire_dtype`).
WIRE_DTYPES = ("float32", "bfloat16", "float16")
