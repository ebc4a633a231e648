"""Finds every `except X` that guards a nursery and cannot see an X raised inside it.

trio's nurseries are strict (`strict_exception_groups`, trio >= 0.25): whatever a child task or
the nursery's own body raises leaves the `async with` wrapped in an ExceptionGroup, so

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_lease_alive, ...)   # raises LeaseLost
            ...
    except LeaseLost:                                    # never matches: it is a group
        ...

lets the error through and ends whatever runs above it (nsqlookupd exited so on a lost etcd
lease). The same holds for asyncio's TaskGroup, and for a call that opens a nursery inside
(`trio.serve_listeners`, or a function of ours that does): its errors come out grouped too.

The rule this module checks: a `try` whose body opens a nursery, directly or through a call of
a function that does, catches with `except*` (which sees an X alone or in a group), or with a
clause that sees groups (`except Exception`, `except BaseException`, a bare `except`, or an
exception-group type). A plain `except X` there is reported with where the nursery is.

Calls are followed where the names say which function runs: `self.method()` in the same
class, a function of the same module or imported from another module of the product, and a
method of an object whose class is known: an attribute the class sets from a constructor
(`self.session = ClusterSession(...)`) or annotates, a local variable made by one, or a
parameter annotated with it. A call the checker cannot resolve is not followed.
"""

import ast
from dataclasses import dataclass, field
from pathlib import Path

# Calls that open a nursery inside and let its children's errors out grouped.
NURSERY_FACTORIES = {"open_nursery", "TaskGroup"}
SERVING_CALLS = {"serve_listeners", "serve_tcp", "serve_ssl_over_tcp"}
# Handler types that see an ExceptionGroup.
GROUP_SEEING = {"Exception", "BaseException", "ExceptionGroup", "BaseExceptionGroup"}


@dataclass
class Function:
    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    path: Path
    class_name: str | None
    # Where it opens a nursery itself (line numbers), and what it calls (resolved keys).
    opens: list[int] = field(default_factory=list)
    calls: list[tuple[str, int]] = field(default_factory=list)
    local_kinds: dict[str, str] | None = None


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    handler: str
    function: str
    nursery: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: `except {self.handler}` in {self.function} guards a"
            f" nursery ({self.nursery}) and never sees a {self.handler} raised inside it"
            " (it comes out in an ExceptionGroup): use `except*`"
        )


def _own_nodes(body: list[ast.stmt]):
    """The nodes of `body`, not descending into nested functions, lambdas or classes (their
    code runs elsewhere)."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if not isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
            ):
                stack.append(child)


def _call_name(call: ast.expr) -> str | None:
    func = call.func if isinstance(call, ast.Call) else None
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


class Program:
    """The product's functions, what opens nurseries, and what calls what."""

    def __init__(self, root: Path, files: list[Path], module_of) -> None:
        self.root = root
        self.functions: dict[str, Function] = {}
        self._imports: dict[str, dict[str, str]] = {}
        self._classes: set[str] = set()
        # Class key -> attribute -> the class key of what it holds.
        self._attributes: dict[str, dict[str, str]] = {}
        self._trees: dict[str, tuple[Path, ast.Module]] = {}
        for path in files:
            module = module_of(path)
            tree = ast.parse(path.read_text(), filename=str(path))
            self._trees[module] = (path, tree)
            self._imports[module] = self._imported_names(module, tree)
            self._collect(module, path, tree)
        for module, (_path, tree) in self._trees.items():
            self._collect_attributes(module, tree)
        for function in self.functions.values():
            self._scan(function)
        self._opening = self._transitive()

    # -- collecting -----------------------------------------------------------------------

    @staticmethod
    def _imported_names(module: str, tree: ast.Module) -> dict[str, str]:
        """Local name -> the module-qualified name it stands for."""
        names = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = alias.name
        return names

    def _collect(self, module: str, path: Path, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self._add(module, path, node, None)
            elif isinstance(node, ast.ClassDef):
                self._classes.add(f"{module}.{node.name}")
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        self._add(module, path, item, node.name)

    def _add(self, module: str, path: Path, node, class_name: str | None) -> None:
        qualname = f"{class_name}.{node.name}" if class_name else node.name
        self.functions[f"{module}.{qualname}"] = Function(module, qualname, node, path, class_name)
        # Functions defined inside it: their own nurseries count where they are called.
        for inner in ast.walk(node):
            if inner is not node and isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{module}.{qualname}.<locals>.{inner.name}"
                self.functions.setdefault(
                    key, Function(module, f"{qualname}.{inner.name}", inner, path, class_name)
                )

    def _class_key(self, module: str, expression: ast.expr | None) -> str | None:
        """The class an annotation or a constructor's callee names, if it is the product's."""
        if expression is None:
            return None
        if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
            try:
                expression = ast.parse(expression.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(expression, ast.BinOp):  # `Session | None`
            return self._class_key(module, expression.left) or self._class_key(
                module, expression.right
            )
        if isinstance(expression, ast.Call):
            expression = expression.func
        name = None
        if isinstance(expression, ast.Name):
            name = expression.id
            candidates = [f"{module}.{name}", self._imports[module].get(name, "")]
        elif isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name):
            owner = self._imports[module].get(expression.value.id, "")
            candidates = [f"{owner}.{expression.attr}"]
        else:
            return None
        return next((key for key in candidates if key in self._classes), None)

    def _collect_attributes(self, module: str, tree: ast.Module) -> None:
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            attributes = self._attributes.setdefault(f"{module}.{node.name}", {})
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign):
                    targets, value, annotation = inner.targets, inner.value, None
                elif isinstance(inner, ast.AnnAssign):
                    targets, value, annotation = [inner.target], inner.value, inner.annotation
                else:
                    continue
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        kind = self._class_key(module, annotation) or (
                            self._class_key(module, value) if isinstance(value, ast.Call) else None
                        )
                        if kind is not None:
                            attributes.setdefault(target.attr, kind)

    def _locals(self, function: Function) -> dict[str, str]:
        """Local name -> class key: annotated parameters, and variables made by a constructor."""
        known = {}
        arguments = function.node.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
            kind = self._class_key(function.module, argument.annotation)
            if kind is not None:
                known[argument.arg] = kind
        for node in _own_nodes(function.node.body):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                kind = self._class_key(function.module, node.value)
                for target in node.targets:
                    if kind is not None and isinstance(target, ast.Name):
                        known[target.id] = kind
        return known

    def _scan(self, function: Function) -> None:
        for node in _own_nodes(function.node.body):
            if isinstance(node, ast.AsyncWith):
                if any(_call_name(item.context_expr) in NURSERY_FACTORIES for item in node.items):
                    function.opens.append(node.lineno)
            elif isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
                if _call_name(node.value) in SERVING_CALLS:
                    function.opens.append(node.lineno)
                target = self.resolve(function, node.value)
                if target is not None:
                    function.calls.append((target, node.lineno))

    def resolve(self, caller: Function, call: ast.Call) -> str | None:
        """The key of the product function `call` runs, when its names say which."""
        func = call.func
        module = caller.module
        candidates = []
        own_class = f"{module}.{caller.class_name}" if caller.class_name else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self" and own_class:
                candidates.append(f"{own_class}.{func.attr}")
            elif owner in (local_kinds := self._local_kinds(caller)):
                candidates.append(f"{local_kinds[owner]}.{func.attr}")
            elif owner in self._imports[module]:
                candidates.append(f"{self._imports[module][owner]}.{func.attr}")
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name)
            and func.value.value.id == "self"
            and own_class
        ):
            held = self._attributes.get(own_class, {}).get(func.value.attr)
            if held is not None:
                candidates.append(f"{held}.{func.attr}")
        elif isinstance(func, ast.Name):
            local = f"{module}.{caller.qualname}.<locals>.{func.id}"
            candidates += [local, f"{module}.{func.id}"]
            if func.id in self._imports[module]:
                candidates.append(self._imports[module][func.id])
        return next((key for key in candidates if key in self.functions), None)

    def _local_kinds(self, function: Function) -> dict[str, str]:
        if function.local_kinds is None:
            function.local_kinds = self._locals(function)
        return function.local_kinds

    def _transitive(self) -> dict[str, str]:
        """Function key -> where the nursery it opens is (its own, or a callee's)."""
        opening: dict[str, str] = {}
        for key, function in self.functions.items():
            if function.opens:
                opening[key] = f"{self._where(function, function.opens[0])}"
        changed = True
        while changed:
            changed = False
            for key, function in self.functions.items():
                if key in opening:
                    continue
                for callee, line in function.calls:
                    if callee in opening:
                        opening[key] = (
                            f"{self._where(function, line)} calls"
                            f" {self.functions[callee].qualname}, {opening[callee]}"
                        )
                        changed = True
                        break
        return opening

    def _where(self, function: Function, line: int) -> str:
        return f"{function.path.relative_to(self.root)}:{line}"

    # -- checking -------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        found = []
        for function in self.functions.values():
            for node in _own_nodes(function.node.body):
                if isinstance(node, ast.Try):  # ast.TryStar is `except*`: it sees groups
                    nursery = self._nursery_in(function, node.body)
                    if nursery is None:
                        continue
                    for handler in node.handlers:
                        blind = _blind_types(handler)
                        if blind:
                            found.append(
                                Finding(
                                    function.path.relative_to(self.root),
                                    handler.lineno,
                                    ", ".join(blind),
                                    function.qualname,
                                    nursery,
                                )
                            )
        return sorted(found, key=lambda finding: (str(finding.path), finding.line))

    def _nursery_in(self, function: Function, body: list[ast.stmt]) -> str | None:
        """Where a nursery opens inside `body` (itself or through a call), or None."""
        for node in _own_nodes(body):
            if isinstance(node, ast.AsyncWith) and any(
                _call_name(item.context_expr) in NURSERY_FACTORIES for item in node.items
            ):
                return self._where(function, node.lineno)
            if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
                if _call_name(node.value) in SERVING_CALLS:
                    return self._where(function, node.lineno)
                target = self.resolve(function, node.value)
                if target is not None and target in self._opening:
                    return (
                        f"{self._where(function, node.lineno)} calls"
                        f" {self.functions[target].qualname}, {self._opening[target]}"
                    )
        return None


def _blind_types(handler: ast.ExceptHandler) -> list[str]:
    """The types a plain `except` clause names that do not see an ExceptionGroup; none for a
    bare `except` or one that names a group-seeing type."""
    if handler.type is None:
        return []
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = [ast.unparse(kind) for kind in types]
    if any(name.split(".")[-1] in GROUP_SEEING for name in names):
        return []
    return names
