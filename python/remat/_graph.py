"""Any module as a chain: its forward captured by ``torch.export`` and split into stages.

``torch.export.export(model, args, kwargs, strict=False)`` traces the forward the model's own
Python runs, operation by operation (ATen operations, the same kernels eager mode calls), for
one input signature: keyword arguments, dicts and ``ModelOutput``s in and out, data-dependent
Python resolved for the sample. Non-strict export runs the forward as Python runs it, so that
Hugging Face's, timm's and torchvision's models go through as they come; ``torch.fx``'s
symbolic tracing stops at any Python that looks at a tensor's value (a Hugging Face mask
built from ``input_ids``). The graph's parameters and buffers are the model's own, looked up
by name at each call: an optimizer over ``model.parameters()`` trains them, and
``model.to()`` or ``load_state_dict`` are seen.

The graph is split by remat's partitioner (``remat::partition_graph``, the C++ solver library):
each operation a node, with the bytes it makes, what it reads, what it views and what it
writes in place; a stage never cuts between a tensor and an in-place write to it, nor between
a tuple and its items. Each stage runs its nodes on the tensors crossing into it (the chain's
tuple members; a tensor read further on passes through, carried) and returns those crossing
out of it.
"""

from __future__ import annotations

import json
import operator
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _C

# Rough rates, only to weigh operations against each other and against their bytes when the
# graph is split (the stages are measured afterwards): matrix products and convolutions by
# their multiply-adds, everything else by the bytes it reads and writes.
_FLOPS_PER_MS = 50e6
_BYTES_PER_MS = 10e6
_COMPUTE_OPS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d",
    "aten::scaled_dot_product_attention", "aten::einsum",
}


# Operations that return their argument itself, or a new tensor, depending on its layout or
# type: a stage's output would be its input passed on (carried) or not depending on how the
# input is handed, so they stay in their argument's stage (GraphNode::stays_with).
_MAY_RETURN_SELF = {"aten::contiguous", "aten::to", "aten::type_as", "aten::flatten"}
# A dropout returns its argument itself where its probability is 0 or it is not training
# (timm's EfficientViT: nn.Dropout(0.0) in every convolution block).
_DROPOUTS = {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
             "aten::feature_alpha_dropout"}


def _returns_self(n: torch.fx.Node, schema) -> bool:
    if schema is None:
        return False
    if schema.name in _MAY_RETURN_SELF:
        return True
    if schema.name in _DROPOUTS:
        p, train = (_bound_arguments(n, schema) + [None, None])[1:3]
        return p == 0 or train is False
    return False


# Operations whose kernel depends on which arguments require grad: PyTorch's attention on the
# CPU runs its math kernel where the mask needs a gradient and flash attention where nothing
# does, two kernels that round otherwise. A forward without autograd (a schedule's, before
# the recomputation that keeps what the backward reads) must run the training step's kernel.
_ATTENTION = {torch.ops.aten.scaled_dot_product_attention.default}


def _attention_as_trained(grads: Tuple[bool, ...], *args: Any, **kwargs: Any) -> torch.Tensor:
    """aten.scaled_dot_product_attention as the model's training step runs it: outside
    autograd, each tensor argument that requires grad in that step is handed as one that does
    (an alias of it; nothing is recorded), so that the kernel chosen is the step's."""
    if not torch.is_grad_enabled():
        args = tuple(a.detach().requires_grad_() if wanted and isinstance(a, torch.Tensor) and
                     not a.requires_grad and a.is_floating_point() else a
                     for a, wanted in zip(args, grads))
    return torch.ops.aten.scaled_dot_product_attention.default(*args, **kwargs)


class CaptureError(ValueError):
    """A model whose forward remat cannot capture or split, and what to do instead."""


def export_available() -> bool:
    """Whether this torch can capture a model for training (``torch.export``'s training IR,
    torch 2.5 and later)."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version >= (2, 5) and hasattr(torch, "export")


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return int(t.numel() * t.element_size())


def _leaves(value: Any) -> List[Any]:
    """The tensors (or fake tensors) in an argument or a value, nested in lists and tuples."""
    if isinstance(value, (list, tuple)):
        out: List[Any] = []
        for item in value:
            out.extend(_leaves(item))
        return out
    return [value]


class _FunctionsApplied:
    """Within it, the ``torch.autograd.Function`` subclasses that the code applies, in order of
    their first application. torch.export traces such a Function's forward into ATen operations
    and drops its own backward: the captured graph differentiates the forward instead."""

    def __init__(self) -> None:
        self.classes: List[type] = []
        self._original = None

    def __enter__(self) -> "_FunctionsApplied":
        # Function's own apply: a Python classmethod up to torch 2.14, LibTorch's
        # (a classmethod_descriptor) from 2.15 on; either, bound to the subclass, applies it.
        base = torch.autograd.Function
        self._original = base.__dict__["apply"]
        original, classes = self._original, self.classes

        def apply(cls, *args: Any, **kwargs: Any) -> Any:
            if cls not in classes:
                classes.append(cls)
            return original.__get__(None, cls)(*args, **kwargs)

        base.apply = classmethod(apply)
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.Function.apply = self._original


def _function_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _own_backward_gradients(module: nn.Module, args: tuple, kwargs: dict) -> Dict[str, torch.Tensor]:
    """The gradients of a fixed, random weighting of ``module``'s floating-point outputs,
    for each parameter and each input that requires one (by name; the inputs in the order of
    ``args`` and ``kwargs``), the random generators as they were."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    inputs = [t for t in _leaves(list(args) + [kwargs[k] for k in sorted(kwargs)])
              if isinstance(t, torch.Tensor) and t.requires_grad]
    named += [(f"the model's input {k}", t) for k, t in enumerate(inputs)]
    if not named:  # nothing to differentiate
        return {}
    devices = sorted({p.device.index or 0 for _, p in named if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        outputs = module(*args, **kwargs)
        leaves = [t for t in _leaves(_flat_outputs(outputs))
                  if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
        generator = torch.Generator().manual_seed(0)
        loss = sum((t.float() * torch.rand(t.shape, generator=generator).to(t.device)).sum()
                   for t in leaves)
    if not leaves:
        return {}
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: g for (n, _), g in zip(named, grads) if g is not None}


def _flat_outputs(value: Any) -> Any:
    from torch.utils._pytree import tree_flatten
    if isinstance(value, dict):  # a ModelOutput, a dict
        return [_flat_outputs(v) for v in value.values()]
    if isinstance(value, (list, tuple)):
        return [_flat_outputs(v) for v in value]
    return tree_flatten(value)[0] if not isinstance(value, torch.Tensor) else value


def _check_own_backwards(model: nn.Module, program: Any, args: tuple, kwargs: dict,
                         classes: List[type]) -> None:
    """The model applies autograd Functions, whose own backwards the capture lost: refuses it
    where differentiating their forwards gives other gradients than their backwards (a
    straight-through estimator: a rounding whose backward passes the gradient on), and warns
    where the two agree only to rounding."""
    import warnings
    names = ", ".join(_function_name(c) for c in classes)
    own = _own_backward_gradients(model, args, kwargs)
    captured = _own_backward_gradients(program.module(), args, kwargs)
    # Apart by a thousandth of a gradient's largest value, or 16 of its type's roundings (a
    # bfloat16 model's gradients round at 1/128).
    worst, where, refused = 0.0, None, False
    for name, g in own.items():
        c = captured.get(name)
        scale = float(g.abs().max()) if g.numel() else 0.0
        if c is None:
            difference = scale
        else:
            difference = float((g.float() - c.float()).abs().max()) if g.numel() else 0.0
        relative = difference / scale if scale > 0 else (0.0 if difference == 0 else float("inf"))
        tolerance = max(1e-3, 16 * torch.finfo(g.dtype).eps)
        if (relative > tolerance, relative) > (refused, worst):
            worst, where, refused = relative, name, relative > tolerance
    if refused:
        raise CaptureError(
            f"{type(model).__name__} applies {names} (a torch.autograd.Function), whose own "
            "backward a capture cannot keep: torch.export traces its forward into operations "
            "and the captured model is differentiated through them, and here that gives other "
            f"gradients than its backward ({where}: {worst:.3g} of its largest value apart). "
            "Give the model to remat as a chain instead (an nn.Sequential, or a list of its "
            "blocks, remat.Checkpointable), whose stages run the Function and its backward")
    if worst > 0:
        warnings.warn(
            f"remat: {type(model).__name__} applies {names} (a torch.autograd.Function), whose "
            "own backward a capture cannot keep: the captured model is differentiated through "
            "its forward instead. On the sample the two agree to rounding "
            f"({worst:.2g} of the largest value apart, at {where}), so the gradients equal the "
            "model's own to rounding, not bit for bit", stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of warnings.warn, called where this is called, that names the first
    frame outside the remat package: the caller's line, however deep the capture began."""
    import os
    import sys
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == package:
        frame, level = frame.f_back, level + 1
    return level


def _schema(node: torch.fx.Node):
    return getattr(node.target, "_schema", None)


def _estimate_ms(node: torch.fx.Node, value: Any) -> Tuple[float, float]:
    """A node's forward and backward time, roughly (see _FLOPS_PER_MS)."""
    outputs = [v for v in _leaves(value) if isinstance(v, torch.Tensor)]
    inputs = [a.meta.get("val") for a in node.all_input_nodes]
    inputs = [v for v in inputs if isinstance(v, torch.Tensor)]
    moved = sum(t.numel() * t.element_size() for t in outputs + inputs)
    memory_ms = moved / _BYTES_PER_MS
    schema = _schema(node)
    name = schema.name if schema is not None else ""
    if name in _COMPUTE_OPS and outputs:
        out = outputs[0]
        if name.startswith("aten::conv") and len(inputs) >= 2:
            weight = inputs[1]
            flops = 2 * out.numel() * (weight.numel() // max(1, weight.shape[0]))
        elif name == "aten::scaled_dot_product_attention" and len(inputs) >= 2:
            flops = 4 * out.numel() * inputs[1].shape[-2]
        elif len(inputs) >= 2:
            # A product's inner size: the first operand's last dimension.
            flops = 2 * out.numel() * (inputs[0].shape[-1] if inputs[0].dim() else 1)
        else:
            flops = 0
        compute_ms = flops / _FLOPS_PER_MS
        return compute_ms + memory_ms, 2 * compute_ms + memory_ms
    return memory_ms, memory_ms


class CapturedGraph:
    """One capture of ``model`` for one input signature: the exported program, the nodes the
    partitioner sees, and the stages of a split."""

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict, max_stages: int):
        if not export_available():
            raise CaptureError(
                f"capturing a model for training needs torch 2.5 or later (torch.export's "
                f"training graphs); this is torch {torch.__version__}. Give the model as a chain "
                "instead: an nn.Sequential, or a list of its blocks")
        self.model = model
        # Where the stages read their parameters and buffers (_state_table): module path ->
        # module, and a count of the times they were looked up again after a module changed.
        self._owners: Dict[str, nn.Module] = {}
        self._stage_tables_version = 0
        start = time.perf_counter()
        try:
            with _FunctionsApplied() as functions:
                self.program = torch.export.export(model, args, kwargs, strict=False)
        except Exception as error:  # what export raises varies: say where and what to do
            eager = _eager_error(model, args, kwargs)
            if eager is not None:  # the model's own error, not the capture's
                raise CaptureError(_eager_advice(model, eager)) from eager
            raise CaptureError(_capture_advice(model, error)) from error
        if functions.classes:
            _check_own_backwards(model, self.program, args, kwargs, functions.classes)
        #: Seconds spent exporting the model, and reading its graph and splitting it.
        self.export_seconds = time.perf_counter() - start
        start = time.perf_counter()
        self._read_signature()
        self._read_nodes()
        self._split(max_stages)
        self.split_seconds = time.perf_counter() - start

    # ---- the exported program's inputs and outputs ---------------------------------------

    def _read_signature(self) -> None:
        from torch.export.graph_signature import InputKind, OutputKind
        signature = self.program.graph_signature
        self.in_spec = self.program.call_spec.in_spec
        self.out_spec = self.program.call_spec.out_spec
        # Placeholder name -> ("parameter" | "buffer" | "constant", fully qualified name).
        self.state: Dict[str, Tuple[str, str]] = {}
        # The user inputs, in the flattened (args, kwargs) order: the placeholder's name for a
        # tensor, None for a constant that export specialized (a flag, a scale).
        self.user_inputs: List[Optional[str]] = []
        for spec in signature.input_specs:
            name = getattr(spec.arg, "name", None)
            if spec.kind == InputKind.PARAMETER:
                self.state[name] = ("parameter", spec.target)
            elif spec.kind == InputKind.BUFFER:
                self.state[name] = ("buffer", spec.target)
            elif spec.kind == InputKind.CONSTANT_TENSOR:
                self.state[name] = ("constant", spec.target)
            elif spec.kind == InputKind.USER_INPUT:
                is_tensor = type(spec.arg).__name__ in ("TensorArgument",)
                self.user_inputs.append(name if is_tensor else None)
            else:
                raise CaptureError(f"the captured forward takes a {spec.kind.name.lower()} input, "
                                   "which remat does not run: give the model as a chain instead")
        self.user_outputs: List[str] = []
        for spec in signature.output_specs:
            if spec.kind != OutputKind.USER_OUTPUT:
                raise CaptureError(
                    f"the captured forward has a {spec.kind.name.lower()} output (an input or "
                    "buffer replaced rather than updated in place), which remat does not run: "
                    "give the model as a chain instead")
            if type(spec.arg).__name__ != "TensorArgument":
                raise CaptureError(
                    "the model returns a value that is not a tensor "
                    f"({getattr(spec.arg, 'value', spec.arg)!r}): remat trains models whose "
                    "outputs are tensors (in tuples, dicts or ModelOutputs)")
            self.user_outputs.append(spec.arg.name)

    # ---- the graph as the partitioner sees it ----------------------------------------------

    def _read_nodes(self) -> None:
        graph = self.program.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        self.input_nodes = [placeholders[name] for name in self.user_inputs if name is not None]
        self.ops = [n for n in graph.nodes if n.op == "call_function"]
        self.index: Dict[str, int] = {}
        for k, n in enumerate(self.input_nodes + self.ops):
            self.index[n.name] = k
        requires_grad = {name for name, (kind, fqn) in self.state.items()
                         if kind == "parameter" and self._tensor_of(kind, fqn).requires_grad}
        self._parameters_with_grad = requires_grad
        self.nodes: List[dict] = []
        self.grad: Dict[str, bool] = {}
        for n in self.input_nodes:
            value = n.meta.get("val")
            grad = bool(getattr(value, "requires_grad", False))
            self.grad[n.name] = grad
            self.nodes.append({"name": n.name, "input": True,
                               "bytes": _storage_bytes(value) if isinstance(value, torch.Tensor) else 0,
                               "grad": grad})
        for n in self.ops:
            self.nodes.append(self._node(n, requires_grad))
        outputs = set(self.user_outputs)
        for entry, n in zip(self.nodes, self.input_nodes + self.ops):
            if n.name in outputs:
                entry["output"] = True
        missing = outputs - set(self.index)
        if missing:
            raise CaptureError(f"the model returns {sorted(missing)}, which is a parameter or a "
                               "buffer, not a value it computes: remat cannot train that output")

    def _node(self, n: torch.fx.Node, requires_grad: set) -> dict:
        value = n.meta.get("val")
        entry: Dict[str, Any] = {"name": n.name}
        reads = sorted({self.index[a.name] for a in n.all_input_nodes if a.name in self.index})
        if reads:
            entry["reads"] = reads
        uses_grad = any(a.name in requires_grad or self.grad.get(a.name, False)
                        for a in n.all_input_nodes)
        tensor = isinstance(value, torch.Tensor)
        grad = bool(tensor and value.is_floating_point() and uses_grad)
        # A tuple's items (aten.chunk's, aten.var_mean's) need a gradient where its operation
        # read one: their getitem nodes see it here.
        self.grad[n.name] = grad if tensor else uses_grad
        if not grad:
            entry["grad"] = False
        if not tensor:
            entry["tensor"] = False
        fwd, bwd = _estimate_ms(n, value)
        entry["fwd_ms"], entry["bwd_ms"] = fwd, bwd if grad else 0.0
        base = self._aliased_argument(n)
        if n.target is operator.getitem:
            # An item of a tuple: a view of what the tuple's operation views, else its own.
            source = n.args[0]
            base = self._aliased_argument(source) if isinstance(source, torch.fx.Node) else None
        if tensor and base is not None and base.name in self.index:
            entry["view_of"] = self.index[base.name]
        elif tensor and base is not None and base.name in self.state:
            entry["bytes"] = 0  # a view of a parameter or buffer: no activation of its own
        elif tensor:
            entry["bytes"] = _storage_bytes(value)
        schema = _schema(n)
        stays_with = []
        if _returns_self(n, schema) and n.args and \
                isinstance(n.args[0], torch.fx.Node) and n.args[0].name in self.index and \
                self.index[n.args[0].name] >= len(self.input_nodes):
            stays_with.append(self.index[n.args[0].name])
        # A view made right after what it views (only views between them) stays in its stage:
        # the gradient a stage boundary passes down is then a computing operation's, laid out
        # as the profiler's (a permute's backward returns a permuted gradient, which a
        # reshape's backward in the stage below would copy, beyond what that stage was measured
        # with). A view costs nothing to keep there. A view of something made long before (a
        # slice of the rotary tables in each of Llama's layers) does not glue the stages
        # between them into one.
        if tensor and base is not None and base.name in self.index:
            b, v = self.index[base.name], len(self.nodes)
            if b >= len(self.input_nodes) and all("view_of" in self.nodes[k] for k in range(b + 1, v)):
                stays_with.append(b)
        if stays_with:
            entry["stays_with"] = sorted(set(stays_with))
        written = self._written_arguments(n)
        writes = sorted({self.index[w.name] for w in written if w.name in self.index})
        if writes:
            entry["writes"] = writes
        return entry

    def training_grads(self, n: torch.fx.Node) -> Tuple[bool, ...]:
        """Which of the node's positional arguments require grad in the model's training step
        (False for those that are not tensors)."""
        return tuple(isinstance(a, torch.fx.Node) and
                     (self.grad.get(a.name, False) or a.name in self._parameters_with_grad)
                     for a in n.args)

    def _aliased_argument(self, n: torch.fx.Node) -> Optional[torch.fx.Node]:
        """The argument whose storage the node's result shares (a view, an in-place result)."""
        schema = _schema(n)
        if schema is None or not schema.returns:
            return None
        alias = schema.returns[0].alias_info
        if alias is None:
            return None
        for argument, value in zip(schema.arguments, _bound_arguments(n, schema)):
            if argument.alias_info is not None and isinstance(value, torch.fx.Node) and \
                    set(argument.alias_info.before_set) & set(alias.before_set):
                return value
        return None

    def _written_arguments(self, n: torch.fx.Node) -> List[torch.fx.Node]:
        schema = _schema(n)
        if schema is None:
            return []
        written = []
        for argument, value in zip(schema.arguments, _bound_arguments(n, schema)):
            if argument.alias_info is not None and argument.alias_info.is_write:
                written.extend(v for v in _leaves(value) if isinstance(v, torch.fx.Node))
        return written

    def _tensor_of(self, kind: str, fqn: str) -> torch.Tensor:
        if kind == "parameter":
            return self.model.get_parameter(fqn)
        if kind == "buffer":
            return self.model.get_buffer(fqn)
        return self.program.constants[fqn]

    def _state_table(self, kind: str, fqn: str) -> Tuple[dict, str]:
        """The dict that holds a parameter or buffer (its module's ``_parameters`` or
        ``_buffers``), or the program's constants, and its key there: read at each call, a tensor
        replaced on its module (``module.weight = nn.Parameter(...)``, ``load_state_dict(...,
        assign=True)``) is seen, without walking the module path at each call (get_parameter
        took 20-60 us a tensor, most of a small stage's time)."""
        if kind == "constant":
            return self.program.constants, fqn
        path, _, name = fqn.rpartition(".")
        owner = self.model.get_submodule(path)
        self._owners[path] = owner
        return (owner._parameters if kind == "parameter" else owner._buffers), name

    def check_owners(self) -> bool:
        """Whether the modules that hold the stages' parameters and buffers are still the model's
        (one walk of their paths, a step's check); False after one was replaced
        (``model.fc = nn.Linear(...)``): the stages then look their tensors up again."""
        for path, owner in self._owners.items():
            module = self.model
            for part in path.split(".") if path else ():
                module = module._modules.get(part)
                if module is None:
                    break
            if module is not owner:
                self._owners.clear()
                self._stage_tables_version += 1
                return False
        return True

    # ---- the split and its stages ----------------------------------------------------------

    def graph_json(self) -> str:
        name = type(self.model).__name__
        return json.dumps({"format": "remat-graph/1", "name": name, "nodes": self.nodes})

    def _split(self, max_stages: int) -> None:
        ends, self.legal_boundaries = _C.partition_graph(self.graph_json(), max_stages,
                                                          type(self.model).__name__)
        all_nodes = self.input_nodes + self.ops
        count = len(all_nodes)
        # One past the last position where each value is needed (count + 1: returned).
        end = [k + 1 for k in range(count)]
        outputs = set(self.user_outputs)
        for k, n in enumerate(all_nodes):
            for a in n.all_input_nodes:
                if a.name in self.index:
                    end[self.index[a.name]] = max(end[self.index[a.name]], k + 1)
            if n.name in outputs:
                end[k] = count + 1
        tensors = [isinstance(n.meta.get("val"), torch.Tensor) for n in all_nodes]

        def crossing(position: int) -> List[int]:  # the members after node `position`
            return [v for v in range(position + 1) if tensors[v] and end[v] > position + 1]

        inputs = len(self.input_nodes)
        self.members: List[List[int]] = [list(range(inputs))]
        begin = inputs
        self.stage_nodes: List[List[torch.fx.Node]] = []
        for stop in ends:
            self.stage_nodes.append(all_nodes[begin:stop])
            if stop == count:  # the last stage returns what the model does, once each
                self.members.append(sorted({self.index[name] for name in outputs}))
            else:
                self.members.append(crossing(stop - 1))
            begin = stop
        self.all_nodes = all_nodes

    def stages(self) -> List[Tuple[str, "_GraphStage"]]:
        """(name, stage) for each stage. A stage is named by the modules its operations come
        from, the first and the last ("5:layer1.0.conv1..layer1.0.relu"), where the model's
        own operations run outside any submodule by the operations ("3:add..relu")."""
        return [(f"{k}:{stage_label(nodes)}", _GraphStage(self, k))
                for k, nodes in enumerate(self.stage_nodes)]


def module_path(node: torch.fx.Node) -> str:
    """The innermost module whose forward ran the operation ("layer1.0.conv1"), or ""."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""


def stage_label(nodes: Sequence[torch.fx.Node]) -> str:
    """What a stage's nodes compute, for its name: the first and the last module path, or the
    first and the last operation where none ran inside a submodule."""
    paths = [p for p in (module_path(n) for n in nodes if n.op == "call_function") if p]
    first, last = (paths[0], paths[-1]) if paths else (nodes[0].name, nodes[-1].name)
    return first if first == last else f"{first}..{last}"


def _bound_arguments(n: torch.fx.Node, schema) -> List[Any]:
    """The node's arguments in its schema's order (positional, then by keyword)."""
    values = list(n.args)
    for argument in schema.arguments[len(values):]:
        values.append(n.kwargs.get(argument.name))
    return values


class _GraphStage(nn.Module):
    """The nodes of one stage as a module: called with the members of x_k, returns those of
    x_{k+1}. Its parameters and buffers are the model's, looked up at each call."""

    def __init__(self, captured: CapturedGraph, k: int):
        super().__init__()
        index = captured.index
        members_in = [captured.all_nodes[v] for v in captured.members[k]]
        members_out = [captured.all_nodes[v] for v in captured.members[k + 1]]
        graph = torch.fx.Graph()
        env: Dict[str, torch.fx.Node] = {}
        for n in members_in:
            env[n.name] = graph.placeholder(n.name)
        state: List[Tuple[str, str]] = []
        # The submodules of higher-order operations (a region under torch.autocast or
        # torch.no_grad in the forward), as the exported program holds them.
        root = nn.Module()
        for n in captured.stage_nodes[k]:
            for a in n.all_input_nodes:
                if a.name in env:
                    continue
                if a.op == "get_attr":
                    setattr(root, a.target, getattr(captured.program.graph_module, a.target))
                    env[a.name] = graph.get_attr(a.target)
                elif a.name in captured.state:
                    env[a.name] = graph.placeholder(a.name)
                    state.append(captured.state[a.name])
                elif a.name in index:  # pragma: no cover - the split guarantees it
                    raise AssertionError(f"this is a bug in remat: stage {k} reads {a.name}, "
                                         "which does not cross into it")
            env[n.name] = graph.node_copy(n, lambda a: env[a.name])
            if n.target in _ATTENTION:
                node = env[n.name]
                node.target = _attention_as_trained
                node.args = (captured.training_grads(n),) + tuple(node.args)
        graph.output(tuple(env[n.name] for n in members_out))
        # The members' placeholders first, then the state's, in the order the code calls them.
        self._code = torch.fx.GraphModule(root, graph)
        self._state = state
        object.__setattr__(self, "_captured", captured)  # not a submodule: no second state_dict
        # Where each state tensor is read, and the parameters' and buffers' among them: looked
        # up again after a module holding them was replaced (check_owners).
        self._tables: List[Tuple[dict, str]] = []
        self._parameter_tables: List[Tuple[dict, str]] = []
        self._buffer_tables: List[Tuple[dict, str]] = []
        self._tables_version = -1
        self._output_count = len(members_out)
        # The generated code's forward, bound once: read at each call without nn.Module's
        # attribute lookup (the code is a submodule, for its higher-order operations).
        object.__setattr__(self, "_run", self._code.forward)

    def _look_up(self) -> None:
        captured = self._captured
        if self._tables_version == captured._stage_tables_version:
            return
        self._tables = [captured._state_table(kind, fqn) for kind, fqn in self._state]
        kinds = [kind for kind, _ in self._state]
        self._parameter_tables = [t for t, k in zip(self._tables, kinds) if k == "parameter"]
        self._buffer_tables = [t for t, k in zip(self._tables, kinds) if k == "buffer"]
        self._tables_version = captured._stage_tables_version

    def _state_tensors(self) -> List[torch.Tensor]:
        self._look_up()
        return [table[key] for table, key in self._tables]

    def forward(self, *members: torch.Tensor):
        out = self._run(*members, *self._state_tensors())
        return out if self._output_count != 1 else out[0]

    # The runtime calls a stage, which nobody hooks: its call is its forward, without
    # nn.Module's call machinery (hooks, tracing state), which cost about 14 us a stage on the
    # development machine's CPU (host time a GPU's step waits for; docs/performance.md).
    __call__ = forward

    # The runtime asks a stage for its parameters and buffers (BatchNorm statistics are
    # restored after a recomputation; a stage whose parameters need no gradient is run
    # without autograd state): the model's, as this stage uses them.
    def parameters(self, recurse: bool = True):
        self._look_up()
        return iter([table[key] for table, key in self._parameter_tables])

    def buffers(self, recurse: bool = True):
        self._look_up()
        return iter([table[key] for table, key in self._buffer_tables])


def _eager_error(model: nn.Module, args: tuple, kwargs: dict) -> Optional[Exception]:
    """What the model raises when run as it is on the sample (once, without autograd, its
    buffers and the random state put back after), or None: where export fails on an error the
    model makes anyway (BatchNorm given one value per channel), the advice for capturing
    would mislead."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({t.device.index or 0 for t in list(model.parameters()) + list(model.buffers())
                      if t.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model(*args, **kwargs)
    except Exception as error:  # the model's own, whatever it is
        return error
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
    return None


def _eager_advice(model: nn.Module, error: Exception) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return (f"{type(model).__name__} raises on this sample when run as it is, without remat: "
            f"{type(error).__name__}: {first[:300]}. remat captures what runs: change the "
            "sample (its shapes or values) or the model")


def _capture_advice(model: nn.Module, error: Exception) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    where = ""
    for line in reversed(text):
        if 'File "' in line and "torch/" not in line:
            where = f" (at {line.strip()})"
            break
    hint = ("Give the model as a chain instead (an nn.Sequential, or a list of its blocks), or "
            "make the forward's Python independent of tensor values for the sample's shapes.")
    if "DynamicCache" in first or "Cache" in first and "pytree" in first:
        hint = "Pass use_cache=False (remat trains without a key-value cache)."
    return (f"remat could not capture {type(model).__name__}'s forward with torch.export: "
            f"{type(error).__name__}: {first[:300]}{where}. {hint}")
