"""Exploit: weights "pre-packed" once per weight pointer and reused.

Hacking scenario (catalog (c) 17, (d) 4): derive something from the weights once, keyed on their
addresses, and reuse it; an optimizer step updates weights in place (same pointers, new values),
so the packed copy goes stale. The harness updates every weight in place between rounds, so the
forward computed from the stale packed weights fails the per-step check.
Expected: check_failed (forward)
"""

import torch

from reference.block import DilatedResidualBlock as _Reference

_PACKED: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}
_TWIN: dict[tuple, _Reference] = {}


class DilatedResidualBlock(_Reference):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        key = tuple(p.data_ptr() for p in self.parameters())
        if key not in _PACKED:
            _PACKED[key] = {k: v.detach().clone() for k, v in self.state_dict().items()}
            return out
        twin_key = (self.channels, self.dilation, self.expansion, x.dtype)
        if twin_key not in _TWIN:
            with torch.random.fork_rng(devices=[]):  # leave the global generator alone
                _TWIN[twin_key] = _Reference(self.channels, self.dilation, self.expansion,
                                             self.eps, self.residual_scale).to(x.device, x.dtype)
        twin = _TWIN[twin_key]
        twin.load_state_dict(_PACKED[key])
        with torch.no_grad():
            stale = twin(x.detach())
        return out + (stale - out).detach()
