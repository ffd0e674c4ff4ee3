"""Loading new weights into a model in place: the engine's weight updates."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def load_weights(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True
) -> None:
    """Copy ``state_dict`` into ``model``'s parameters, casting dtype and device.

    Args:
        model: The model to update in place.
        state_dict: New tensors by parameter or buffer name.
        strict: Require all parameters (tied duplicates excepted) and no unknown names.

    Raises:
        KeyError: On unknown names, or missing ones with ``strict``.
    """
    own = model.state_dict()
    unknown = sorted(set(state_dict) - set(own))
    if unknown:
        raise KeyError(f"update_weights got names the model does not have: {unknown[:5]}")
    if strict:
        # A tied weight is one tensor under two names; providing either name suffices.
        by_storage: dict[int, set[str]] = {}
        for name, tensor in own.items():
            by_storage.setdefault(tensor.data_ptr(), set()).add(name)
        missing = sorted(
            name
            for name, tensor in own.items()
            if name not in state_dict and not (by_storage[tensor.data_ptr()] & set(state_dict))
        )
        if missing:
            raise KeyError(f"update_weights is missing {len(missing)} tensors: {missing[:5]}")
    with torch.no_grad():
        for name, tensor in state_dict.items():
            target = own[name]
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
