"""estimator-dist: multi-worker tf.estimator training with MultiWorkerMirroredStrategy."""

import importlib.util
import pathlib
import sys

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent


def _compat():
    """estimator_dist/tf_runtime/compat.py alone (standard library only), for its Python check."""
    path = HERE / "estimator_dist" / "tf_runtime" / "compat.py"
    spec = importlib.util.spec_from_file_location("_estimator_dist_compat", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# pip builds the metadata with the Python it installs for, but does not refuse a local project
# whose python_requires excludes it: it goes on to fail on TensorFlow. One line instead.
_COMPAT = _compat()
if not _COMPAT.python_supported(sys.version_info[:2]):
    sys.exit(_COMPAT.UNSUPPORTED_PYTHON.format(version=sys.version.split()[0]))
# Two TensorFlow stacks (docs/tensorflow.md). The newest TensorFlow this package supports
# is the default on Python 3.10-3.13; `.[tf215]` selects TensorFlow 2.15, the last release
# that shipped tf.estimator, on Python 3.10 and 3.11, and Python 3.9 has only that stack.
# requirements/tf2.21.txt and requirements/tf2.15.txt pin the tested set of each.
TF_NEWEST = "2.21.0"
TF_215 = "2.15.1"
NEWEST = 'python_version >= "3.10"'
ONLY_215 = 'python_version < "3.10"'
PYTHON_310 = 'python_version == "3.10"'
RAY = ['ray==2.60.0; python_version >= "3.10"', 'ray==2.51.1; python_version < "3.10"']
# The TFJob from the v1 Training SDK's models; the TrainJob and its runtime from the
# Trainer v2 SDK's; kubernetes-validate checks the core kinds against Kubernetes' schemas.
KUBERNETES = ["kubeflow-training==1.9.4", "kubeflow==0.5.0", "kubernetes-validate==1.37.0"]
# What TensorFlow 2.15 needs beside it, wherever it is installed.
STACK_215 = [
    "keras==2.15.0",
    # tensorflow-datasets newer than 4.9.4 pulls protobuf 5+, which TF 2.15 cannot import;
    # 4.9.4 needs Python 3.10, 4.9.3 is the last for 3.9.
    'tensorflow-datasets==4.9.4; python_version >= "3.10"',
    'tensorflow-datasets==4.9.3; python_version < "3.10"',
    "tensorflow-metadata==1.15.0",
    # protobuf's compiled backend: 3.20.3 ships it for Python 3.9 and 3.10 only, and
    # its pure-Python fallback made each checkpoint save 2.4 s and an end-of-training
    # evaluation 57 s on 3.11; 4.25 (upb) has it for 3.11, where tensorflow-metadata
    # 1.15 allows it.
    'protobuf>=3.20.3,<4.21; python_version < "3.11"',
    'protobuf>=4.25.2,<5; python_version >= "3.11"',
    "numpy>=1.23.5,<2",
    # Python 3.9: without these bounds pip backtracked for more than 10 minutes (measured);
    # with them the set resolves (etils 1.5.2, array_record 0.5.1).
    'googleapis-common-protos<1.70; python_version < "3.10"',
    'etils<1.6; python_version < "3.10"',
    'einops<0.9; python_version < "3.10"',
]


def on_python_39(requirement: str) -> str:
    """`requirement` for Python 3.9 alone, where TensorFlow 2.15 is the only stack."""
    name, _, marker = requirement.partition(";")
    return f"{name}; {ONLY_215}" + (f" and{marker}" if marker else "")


# model_dir on object storage (estimator_dist.storage): fsspec's S3 implementation; moto's
# standalone S3 server is what the tests train against. s3fs 2025.10 is the last for 3.9.
S3 = ['s3fs==2026.9.0; python_version >= "3.10"', 's3fs==2025.10.0; python_version < "3.10"']
S3_SERVER = [
    'moto[server]==5.2.5; python_version >= "3.10"',
    'moto[server]==5.1.22; python_version < "3.10"',
]

setup(
    name="estimator-dist",
    version="0.1.0",
    description=(
        "Train tf.estimator models on several workers with MultiWorkerMirroredStrategy: "
        "TF_CONFIG validation, role-aware strategies, a local launcher and absl entry points."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # Every sub-package (estimator_dist/launcher/ray, ...): a plain list would leave them out.
    packages=find_packages(include=["estimator_dist*", "model_fns*", "input_fns*", "run_config*"]),
    # TensorFlow has no wheels for Python 3.14 yet; pip says so in one line.
    python_requires=">=3.9,<3.14",
    install_requires=[
        # The `tensorflow` wheel runs on the CPU wherever no CUDA is found; the `gpu`
        # extra adds the CUDA libraries to the same wheel (no second TensorFlow). Not
        # `tensorflow-cpu`: tf-keras depends on `tensorflow`, so both would be installed.
        f"tensorflow>={TF_215},<2.22; {NEWEST}",
        f"tensorflow=={TF_215}; {ONLY_215}",
        # The last release; it declares no dependencies and runs on every TensorFlow
        # from 2.15 with the compatibility layer of estimator_dist.tf_runtime.
        "tensorflow-estimator==2.15.0",
        # Keras 2 for TensorFlow 2.16 and later (TF_USE_LEGACY_KERAS=1, set by the
        # package): Estimator's layers, canned estimators and checkpoints need it.
        # Each tf-keras release requires its own TensorFlow minor version.
        f"tf-keras>=2.15,<2.22; {NEWEST}",
        f"tensorflow-datasets>=4.9.4,<4.10; {NEWEST}",
        # tensorflow-datasets 4.9.10 imports it when it prepares a dataset but does not
        # declare it: `make demo` failed on a plain `pip install -e .` (Python 3.13).
        f"importlib_resources; {NEWEST}",
        # TensorFlow 2.20 takes protobuf 7, which breaks graph_io.write_graph there.
        f"protobuf>=3.20.3,<7; {NEWEST}",
        f"numpy>=1.23.5,<3; {NEWEST}",
        # Python 3.10: tensorflow-metadata 1.21 caps protobuf at 6.32 there, while the newest
        # googleapis-common-protos (its dependency) needs 6.33.5; without these bounds pip
        # backtracked for more than 10 minutes (measured), with them it resolves in about 1.
        *(
            f"{requirement}; {PYTHON_310}"
            for requirement in ("protobuf<6.33", "googleapis-common-protos<1.76", "etils<1.13")
        ),
        *(on_python_39(requirement) for requirement in STACK_215),
        "absl-py>=1.4",
        "portpicker>=1.5",
        "PyYAML>=5.4",
        # Ships the embedded default dataset (8x8 digits) inside its wheel.
        "scikit-learn>=1.0",
    ],
    extras_require={
        # TensorFlow 2.15 on Python 3.10 or 3.11 (3.9 has it without the extra).
        "tf215": [f"tensorflow=={TF_215}", *STACK_215],
        "gpu": ["tensorflow[and-cuda]"],
        # `--engine=ray` of the launcher. Ray 2.52 and later have no Python 3.9 wheels;
        # both releases keep protobuf < 5 and numpy < 2.
        "ray": RAY,
        # `estimator_dist.manifest`: manifests built from the Kubeflow SDKs' own models.
        "kubernetes": KUBERNETES,
        # --model_dir=s3://... or --storage=s3://...; gs:// needs nothing (TensorFlow writes it),
        # except with --storage (gcsfs), and az:// needs adlfs.
        "s3": S3,
        "gcs": ["gcsfs>=2025.10.0"],
        "azure": ["adlfs>=2025.8.0"],
        # matplotlib: the benchmark suite's plots, which its tests draw too; pandas: the
        # legacy corpus's pandas_input_fn. The engines' extras are in `test` so that CI
        # runs their end-to-end tests.
        "test": [
            "pytest>=7",
            "pytest-timeout>=2.1",
            # `make test` runs the suite in two processes (`-n 2 --dist loadfile`).
            "pytest-xdist>=3.5",
            "ruff==0.17.6",
            "matplotlib>=3.7",
            "pandas>=1.5",
            *RAY,
            *KUBERNETES,
            *S3,
            *S3_SERVER,
        ],
    },
    entry_points={
        "console_scripts": [
            "estimator-dist-train=estimator_dist.train:run",
            "estimator-dist-launch=estimator_dist.launch:run",
            "estimator-dist-check=estimator_dist.check:run",
            "estimator-dist-predict=estimator_dist.predict:run",
            "estimator-dist-manifest=estimator_dist.manifest:run",
            "estimator-dist-convert=input_fns.convert:run",
            "estimator-dist-verify=input_fns.verify:run",
        ]
    },
    classifiers=[
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "License :: OSI Approved :: Apache Software License",
    ],
)
