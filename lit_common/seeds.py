"""One seed from several numbers: the data path's batch order and augmentation, and the model's
mixup."""

_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """One 63-bit seed from several integers (splitmix64), for torch.Generator.manual_seed.

    Any seed, epoch and batch numbers, without overflow, and well apart for neighbours: seed 1 at
    step 0 and seed 0 at step 1 give unrelated streams, where a sum would give the same one.
    """
    state = 0
    for value in values:
        state = (state + (value & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1
