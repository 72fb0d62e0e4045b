"""Normalisation layers: BatchNorm's running stats are `_mean`/`_variance` in paddle, and
InstanceNorm's weight is `scale`. Counters and statistics paddle does not keep are dropped."""

from . import LayerFamily, LayerPair, register


def _batch_norm(pair: LayerPair) -> None:
    pair.rename("weight")
    pair.rename("bias")
    pair.rename("running_mean", "_mean")
    pair.rename("running_var", "_variance")
    pair.drop("num_batches_tracked")


def _affine(pair: LayerPair) -> None:
    pair.rename("weight")
    pair.rename("bias")


def _instance_norm(pair: LayerPair) -> None:
    pair.rename("weight", "scale")
    pair.rename("bias")
    # paddle's InstanceNorm always normalises with the instance's own statistics
    pair.drop("running_mean")
    pair.drop("running_var")
    pair.drop("num_batches_tracked")


register(LayerFamily("batch-norm", ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"),
                     ("BatchNorm1D", "BatchNorm2D", "BatchNorm3D", "BatchNorm", "SyncBatchNorm"), _batch_norm))
register(LayerFamily("layer-norm", ("LayerNorm",), ("LayerNorm",), _affine))
register(LayerFamily("group-norm", ("GroupNorm",), ("GroupNorm",), _affine))
register(LayerFamily("instance-norm", ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"),
                     ("InstanceNorm1D", "InstanceNorm2D", "InstanceNorm3D"), _instance_norm))
