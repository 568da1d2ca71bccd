"""Rewriting the linear layers of an exported program's module (FP8, 2:4 sparsity share this).

Why a graph rewrite, not a module swap: a plan's model is a torch.export program (.pt2), and
`ExportedProgram.module()` has no nn.Linear left, only calls to aten.linear whose weight and bias
are attributes of the graph module. Each such call whose weight is a plain attribute becomes a call
to a new submodule built from that weight and bias.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LINEAR_TARGETS = (torch.ops.aten.linear.default, torch.nn.functional.linear)


def attr(gm: torch.fx.GraphModule, node) -> torch.Tensor | None:
    """The tensor a get_attr node names (None for anything else)."""
    if node is None or getattr(node, "op", None) != "get_attr":
        return None
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj


def add_buffer(gm: torch.fx.GraphModule, prefix: str, tensor: torch.Tensor) -> str:
    """Register `tensor` on gm under a new name (prefix_N) and return the name, for a get_attr node."""
    count = getattr(gm, "_ngcx_buffers", 0)
    gm._ngcx_buffers = count + 1
    name = f"{prefix}_{count}"
    gm.register_buffer(name, tensor)
    return name


def swap_linears(gm: torch.fx.GraphModule, make: Callable[[str, torch.Tensor, torch.Tensor | None],
                                                            torch.nn.Module | None]) -> dict[str, torch.nn.Module]:
    """Replace each aten.linear(x, W, b) with make(key, W, b)(x) where make returns a module; in place.

    key is the weight's attribute path (stable across rebuilds: static FP8 scales are keyed by it).
    Returns the new submodules by key.
    """
    made: dict[str, torch.nn.Module] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in LINEAR_TARGETS:
            continue
        x, w_node = node.args[0], node.args[1]
        b_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        weight = attr(gm, w_node)
        bias = attr(gm, b_node)
        if weight is None or (b_node is not None and bias is None):
            continue                                  # a computed weight or bias: not a layer to swap
        module = make(w_node.target, weight, bias)
        if module is None:
            continue
        name = f"ngcx_{len(made)}_" + w_node.target.replace(".", "_")
        gm.add_submodule(name, module)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, (x,))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        made[w_node.target] = module
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return made
