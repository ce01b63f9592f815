from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import is_uninitialized_parameter


class FusedMessagePassing(MessagePassing):
    r"""The base of the DF-GNN convs: a
    :class:`~torch_geometric.nn.conv.MessagePassing` whose ``forward`` runs
    one fused op instead of ``propagate`` -> ``message`` -> ``aggregate`` ->
    ``update``.

    What PyG would run inside ``propagate`` therefore never runs. Rather than
    skipping it silently, the class refuses it with a clear error: the
    ``register_*_forward_(pre_)hook`` methods of those stages, a subclass
    that overrides one of them, and TorchScript (whose ``propagate`` PyG
    generates from ``message``). Hooks on the module itself
    (:meth:`torch.nn.Module.register_forward_hook`) work as usual.
    """
    #: The stages ``forward`` does not go through.
    FUSED_STAGES: Tuple[str, ...] = (
        'propagate', 'message', 'aggregate', 'message_and_aggregate',
        'update', 'edge_update', 'edge_updater')

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overridden = [name for name in cls.FUSED_STAGES if name in vars(cls)]
        if overridden:
            raise TypeError(
                f"'{cls.__name__}' overrides {overridden} of a DF-GNN conv, "
                f"which runs one fused kernel instead of them (they would "
                f"never be called); subclass the torch_geometric conv to "
                f"change them")

    #: Set once no parameter is lazy any more (none becomes lazy again).
    _materialized = False

    def has_lazy_parameters(self) -> bool:
        """Whether a parameter still waits for its first input (cheap once
        all are materialised)."""
        if self._materialized:
            return False
        if any(is_uninitialized_parameter(p) for p in self.parameters()):
            return True
        self._materialized = True
        return False

    @staticmethod
    def materialize_lazy(*layers: Tuple[Optional[torch.nn.Module],
                                        Optional[Tensor]]) -> None:
        r"""Materialises lazy layers (``in_channels=-1``) from ``(layer,
        input)`` pairs, in the order the torch_geometric conv calls them:
        each draws its initial weights from the global generator when it
        first sees an input, so the order decides which weights a seeded
        model gets. The fused forward calls the layers in another order."""
        for layer, x in layers:
            if layer is None or x is None or not is_uninitialized_parameter(
                    getattr(layer, 'weight', None)):
                continue
            with torch.no_grad():  # (PyG's pre-hook; no rows to project)
                layer(x.narrow(0, 0, 0))

    def check_forward_allowed(self) -> None:
        """Before the fused forward: what it cannot run under -- PyG's
        explainer (edge masks inside ``propagate``) and ``torch.func``
        transforms (the graph cache and the op's autograd functions are not
        functorch-aware) -- is refused."""
        if getattr(self, '_explain', None):
            raise NotImplementedError(
                f"'{self.__class__.__name__}' runs a fused kernel instead of "
                f"'propagate', so explainer edge masks cannot be applied; "
                f"use the torch_geometric conv for explanations")
        if not torch.compiler.is_compiling() and \
                torch._C._functorch.peek_interpreter_stack() is not None:
            raise NotImplementedError(
                f"'{self.__class__.__name__}' does not support torch.func "
                f"transforms (grad, vmap, jacrev, ...); use torch.autograd "
                f"(loss.backward(), torch.autograd.grad) or the "
                f"torch_geometric conv")

    def _refuse_hook(self, stage: str) -> None:
        raise NotImplementedError(
            f"'{self.__class__.__name__}' runs one fused kernel instead of "
            f"'{stage}', so a {stage} hook would never be called; register "
            f"a module hook (register_forward_hook) or use the "
            f"torch_geometric conv")

    def _refused(stage: str) -> Callable:  # type: ignore[misc]
        def register(self, hook: Callable) -> Any:
            self._refuse_hook(stage)
        return register

    register_propagate_forward_pre_hook = _refused('propagate')
    register_propagate_forward_hook = _refused('propagate')
    register_message_forward_pre_hook = _refused('message')
    register_message_forward_hook = _refused('message')
    register_aggregate_forward_pre_hook = _refused('aggregate')
    register_aggregate_forward_hook = _refused('aggregate')
    register_message_and_aggregate_forward_pre_hook = _refused(
        'message_and_aggregate')
    register_message_and_aggregate_forward_hook = _refused(
        'message_and_aggregate')
    register_edge_update_forward_pre_hook = _refused('edge_update')
    register_edge_update_forward_hook = _refused('edge_update')
    del _refused

    def __prepare_scriptable__(self) -> 'FusedMessagePassing':
        # torch.jit.script calls this first: fail here, with a reason,
        # instead of deep inside the TorchScript compiler.
        raise NotImplementedError(
            f"'{self.__class__.__name__}' cannot be compiled with "
            f"TorchScript (torch.jit.script): its forward calls the fused "
            f"op through Python-side graph caching; use torch.compile, or "
            f"the torch_geometric conv where TorchScript is required")

    def jittable(self, typing: Any = None) -> 'FusedMessagePassing':
        return self.__prepare_scriptable__()
