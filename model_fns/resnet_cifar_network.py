"""The ResNet-20/32/56 network (depth 6n+2) for 32x32x3 images, as in TF Model Garden.

The layout follows Model Garden's Keras ResNet for CIFAR
(`official/benchmark/models/resnet_cifar_model.py`):

* a 3x3 convolution with 16 filters, then 3 stages of n basic blocks with
  16, 32 and 64 filters (the first block of stages 2 and 3 has stride 2);
  each block is conv-BN-ReLU-conv-BN plus a shortcut, then ReLU. The first
  block of every stage has a 1x1 convolution + BN shortcut (a projection,
  as in Model Garden), the others the identity. Global average pooling and
  a dense layer produce the logits. ResNet-20 has 272,762 trainable
  parameters.
* batch norm with decay 0.997 and epsilon 1e-5, local or synchronised over
  replicas, optionally with a virtual (ghost) batch; He-normal convolution
  kernels and a N(0, 0.01) dense kernel, seeded from `seed`.

Example:
  >>> import tensorflow as tf
  >>> network = ResnetCifar(ResnetParams(depth=20))
  >>> logits = network(tf.zeros([2, 32, 32, 3]), training=False)
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from model_fns.resnet_cifar_params import ResnetParams

BATCH_NORM_DECAY = 0.997
BATCH_NORM_EPSILON = 1e-5
STAGE_FILTERS = (16, 32, 64)


def count_parameters(depth: int, num_classes: int = 10) -> int:
    """Trainable parameters of the network, computed from its layout.

    Args:
      depth: 6n + 2.
      num_classes: Output classes.

    Returns:
      Convolution kernels, batch norm scales and offsets, dense kernel and bias.

    Example:
      >>> count_parameters(20)
      272762
    """
    blocks = (depth - 2) // 6
    total = 3 * 3 * 3 * STAGE_FILTERS[0] + 2 * STAGE_FILTERS[0]
    channels = STAGE_FILTERS[0]
    for filters in STAGE_FILTERS:
        # Projection shortcut of the first block: 1x1 conv + BN.
        total += channels * filters + 2 * filters
        for block in range(blocks):
            inputs = channels if block == 0 else filters
            total += 9 * inputs * filters + 9 * filters * filters + 4 * filters
        channels = filters
    return total + channels * num_classes + num_classes


class _Initializers:
    """Seeded initialisers, each with its own seed, so equal shapes get different weights."""

    def __init__(self, seed: Optional[int]) -> None:
        self._seed = seed
        self._count = 0

    def _next_seed(self) -> Optional[int]:
        self._count += 1
        return None if self._seed is None else self._seed + self._count - 1

    def conv(self) -> tf.keras.initializers.Initializer:
        return tf.keras.initializers.HeNormal(seed=self._next_seed())

    def dense(self) -> tf.keras.initializers.Initializer:
        return tf.keras.initializers.RandomNormal(stddev=0.01, seed=self._next_seed())


class ResnetCifar(tf.keras.Model):
    """The network: images in [0, 1] to logits.

    Example:
      >>> network = ResnetCifar(ResnetParams(depth=20))
      >>> logits = network(tf.zeros([2, 32, 32, 3]), training=False)
    """

    def __init__(self, params: ResnetParams) -> None:
        super().__init__(name="resnet_cifar")
        self._params = params
        initializers = _Initializers(params.seed)
        self.stem = self._conv(STAGE_FILTERS[0], 3, 1, initializers, "conv1")
        self.stem_bn = self._batch_norm("bn_conv1")
        self.blocks = []
        for stage, filters in enumerate(STAGE_FILTERS):
            for block in range(params.blocks_per_stage):
                name = f"stage{stage + 1}_block{block}"
                strides = 2 if stage > 0 and block == 0 else 1
                layers = {
                    "conv_a": self._conv(filters, 3, strides, initializers, f"{name}_conv_a"),
                    "bn_a": self._batch_norm(f"{name}_bn_a"),
                    "conv_b": self._conv(filters, 3, 1, initializers, f"{name}_conv_b"),
                    "bn_b": self._batch_norm(f"{name}_bn_b"),
                }
                if block == 0:
                    layers["conv_shortcut"] = self._conv(
                        filters, 1, strides, initializers, f"{name}_conv_shortcut"
                    )
                    layers["bn_shortcut"] = self._batch_norm(f"{name}_bn_shortcut")
                self.blocks.append(layers)
        self.dense = tf.keras.layers.Dense(
            params.num_classes,
            kernel_initializer=initializers.dense(),
            dtype=params.dtype,
            name="dense",
        )

    def _conv(
        self, filters: int, size: int, strides: int, initializers: _Initializers, name: str
    ) -> tf.keras.layers.Conv2D:
        return tf.keras.layers.Conv2D(
            filters,
            size,
            strides=strides,
            padding="same",
            use_bias=False,
            kernel_initializer=initializers.conv(),
            dtype=self._params.dtype,
            name=name,
        )

    def _batch_norm(self, name: str) -> tf.keras.layers.BatchNormalization:
        return tf.keras.layers.BatchNormalization(
            momentum=BATCH_NORM_DECAY,
            epsilon=BATCH_NORM_EPSILON,
            synchronized=self._params.batch_norm == "sync",
            virtual_batch_size=self._params.virtual_batch_size,
            dtype=self._params.dtype,
            name=name,
        )

    def call(self, images: tf.Tensor, training: bool = False) -> tf.Tensor:
        images = tf.cast(images, self._params.dtype)
        x = tf.nn.relu(self.stem_bn(self.stem(images), training=training))
        for layers in self.blocks:
            y = tf.nn.relu(layers["bn_a"](layers["conv_a"](x), training=training))
            y = layers["bn_b"](layers["conv_b"](y), training=training)
            if "conv_shortcut" in layers:
                x = layers["bn_shortcut"](layers["conv_shortcut"](x), training=training)
            x = tf.nn.relu(x + y)
        return self.dense(tf.reduce_mean(x, axis=[1, 2]))

    def weight_decay_variables(self) -> List[tf.Variable]:
        """Every convolution kernel, and the dense kernel and bias (not batch norm)."""
        convolutions = [self.stem] + [
            layer for block in self.blocks for key, layer in block.items() if key.startswith("conv")
        ]
        return [conv.kernel for conv in convolutions] + [self.dense.kernel, self.dense.bias]
