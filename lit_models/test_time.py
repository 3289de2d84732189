"""Test-time augmentation: a network's logits averaged over mirror and shifted views of the
images (ImageClassifier's `flip_test` and `translate_test`, and the files export writes).

The caller runs the network on one view at a time, `[net(v) for v in views(x, flip, shift)]`
(no batch several times the size asked for; TorchScript compiles it too), and `averaged` combines
the logits."""

from typing import List

import torch
import torch.nn.functional as F


def views(x: torch.Tensor, flip: bool, shift: int) -> List[torch.Tensor]:
    """The views of images `x` (N, C, H, W): as they are (and mirrored, with flip); then, for a
    shift, shifted by `shift` pixels up-left and down-right, borders reflected (and mirrored)."""
    plain = [x]
    shifted: List[torch.Tensor] = []
    if shift > 0:
        h, w = x.shape[2], x.shape[3]
        padded = F.pad(x, [shift, shift, shift, shift], mode="reflect")
        shifted = [padded[:, :, :h, :w], padded[:, :, 2 * shift:, 2 * shift:]]
    if flip:
        plain = plain + [view.flip(3) for view in plain]
        shifted = shifted + [view.flip(3) for view in shifted]
    return plain + shifted


def averaged(logits: List[torch.Tensor], flip: bool) -> torch.Tensor:
    """The mean of the logits of the views `views` gave (with this `flip`): the images as they are
    (and mirrored) weigh as much as all the shifted views together, as airbench94 weighs them (a
    shifted view has lost a row and a column of the image to reflected ones)."""
    plain = 1 + int(flip)
    if len(logits) == plain:
        return torch.stack(logits).mean(0)
    return (torch.stack(logits[:plain]).mean(0) + torch.stack(logits[plain:]).mean(0)) / 2
