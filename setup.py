"""estimator-dist: multi-worker tf.estimator training with MultiWorkerMirroredStrategy."""

import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
TF_VERSION = "2.15.1"
RAY = ['ray==2.60.0; python_version >= "3.10"', 'ray==2.51.1; python_version < "3.10"']
# The TFJob from the v1 Training SDK's models; the TrainJob and its runtime from the
# Trainer v2 SDK's; kubernetes-validate checks the core kinds against Kubernetes' schemas.
KUBERNETES = ["kubeflow-training==1.9.4", "kubeflow==0.5.0", "kubernetes-validate==1.37.0"]
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
    # tf.estimator was removed in TensorFlow 2.16, and TensorFlow 2.15 supports Python 3.9-3.11.
    python_requires=">=3.9,<3.12",
    install_requires=[
        # The `tensorflow` wheel runs on the CPU wherever no CUDA is found; the `gpu`
        # extra adds the CUDA libraries to the same wheel (no second TensorFlow).
        f"tensorflow=={TF_VERSION}",
        "tensorflow-estimator==2.15.0",
        "keras==2.15.0",
        # tensorflow-datasets newer than 4.9.4 pulls protobuf 5+, which TF 2.15 cannot import.
        "tensorflow-datasets==4.9.4",
        "tensorflow-metadata==1.15.0",
        # protobuf's compiled backend: 3.20.3 ships it for Python 3.9 and 3.10 only, and
        # its pure-Python fallback made each checkpoint save 2.4 s and an end-of-training
        # evaluation 57 s on 3.11; 4.25 (upb) has it for 3.11, where tensorflow-metadata
        # 1.15 allows it.
        'protobuf>=3.20.3,<4.21; python_version < "3.11"',
        'protobuf>=4.25.2,<5; python_version >= "3.11"',
        "numpy>=1.23.5,<2",
        "absl-py>=1.4",
        "portpicker>=1.5",
        "PyYAML>=5.4",
        # Ships the embedded default dataset (8x8 digits) inside its wheel.
        "scikit-learn>=1.0",
    ],
    extras_require={
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}"],
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
