"""What a SavedModel's graph runs, read from saved_model.pb without loading it.

Two rules live here. At every load: each op the file names must be one TensorFlow has, or a
function the file defines; an op from a custom-op library is refused, since dlscale never calls
`tf.load_op_library` (it runs native code). For an uploaded SavedModel, also: no op that reaches
the host outside the tensors it is given (files, Python, the network, summaries, debug sinks), so
that a client cannot read `/etc/passwd` into an output or write a file. Checkpoint ops are
allowed only in the save/restore functions TensorFlow writes into every SavedModel, and no other
function may call those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

from dlscale.errors import ConfigError

#: Op names that read or write the host's files, run Python, talk to the network or to a
#: debugger, or map memory: refused in an uploaded SavedModel (checked as a pattern, so that a
#: new `...V3` of one is refused too).
HOST_OPS = re.compile(
    r"PyFunc|File|Save|Restore|Checkpoint|Reader|Summary|Dataset|Iterator|Debug|Print|Proto"
    r"|Collective|Rpc|Send|Recv|ImmutableConst|LoadAndRemap|VocabRemapping|ShardedFilename"
)
#: The functions `tf.saved_model.save` writes to save and restore variables; they hold
#: checkpoint ops and are run by TensorFlow's own checkpoint code, never by a signature.
_SAVER_FUNCTION = re.compile(r"__inference__traced_(save|restore)_\d+")


def parse(data: bytes, source: str) -> Any:
    """saved_model.pb's bytes as a SavedModel message; a ConfigError when they are not one."""
    message = saved_model_pb2.SavedModel()
    try:
        message.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, or a RuntimeWarning on garbage
        raise ConfigError(f"{source}: not a SavedModel (saved_model.pb): {exc}") from None
    if not message.meta_graphs:
        raise ConfigError(f"{source}: a SavedModel with no graph in it")
    return message


def check_known_ops(message: Any, source: str) -> None:
    """ConfigError naming the custom ops a SavedModel needs (ops its graph names that neither
    TensorFlow has nor the file defines as functions), if any."""
    defined = {f.signature.name for f in _functions(message)}
    used = {n.op for nodes in _node_lists(message) for n in nodes[1]}
    custom = sorted(op for op in used - defined if op_def_registry.get(op) is None)
    if custom:
        raise ConfigError(
            f"{source}: the SavedModel uses ops TensorFlow does not have: {custom}; they come "
            "from a custom-op library, which dlscale does not load (tf.load_op_library runs "
            "native code). Rebuild the model from TensorFlow's own ops"
        )


def host_reaching_ops(message: Any) -> list[str]:
    """Where an uploaded SavedModel would reach the host: "function: op" entries, sorted."""
    found = set()
    for owner, nodes in _node_lists(message):
        saver = _SAVER_FUNCTION.fullmatch(owner) is not None or owner == "<graph>"
        for node in nodes:
            if HOST_OPS.search(node.op) and not saver:
                found.add(f"{owner}: {node.op}")
            if not saver and any(_SAVER_FUNCTION.fullmatch(f) for f in _called(node)):
                found.add(f"{owner}: calls TensorFlow's checkpoint functions")
    if not message.meta_graphs[0].object_graph_def.nodes:
        # A TF1 SavedModel: loading it runs its graph's own restore op, whatever that does.
        found.add("<graph>: a TensorFlow 1 SavedModel (its loading runs the graph's restore op)")
    return sorted(found)


def _functions(message: Any) -> Iterator[Any]:
    for graph in message.meta_graphs:
        yield from graph.graph_def.library.function


def _node_lists(message: Any) -> Iterator[tuple[str, Iterable[Any]]]:
    """(owner, nodes): the top-level graph's nodes, then each function's."""
    for graph in message.meta_graphs:
        yield "<graph>", graph.graph_def.node
    for function in _functions(message):
        yield function.signature.name, function.node_def


def _called(node: Any) -> Iterator[str]:
    """Names of the functions a node calls through its attributes (`f`, branches, bodies)."""
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        yield from (f.name for f in value.list.func)
