"""The GPU's block sizes under Numba's CUDA simulator.

Three kernel modules give their blocks fewer threads under the simulator than on a GPU
(``NAME = small if config.ENABLE_CUDASIM else large``: topk_radix's ``THREADS``, packing's
``PACK_THREADS``, norms' ``TOTAL_THREADS``), so the simulator's cases run in seconds. The
GPU's sizes then never run anywhere but on a GPU. ``use()`` gives those modules the GPU's
values, read from their source, re-evaluates the module constants derived from them
(``STAGE = 8 * PACK_THREADS``, ``TILE = THREADS * ITEMS``, ...), and rebinds the names in
every kernel module that imported them: the simulator then runs the kernels with the
GPU's block sizes, shared arrays and launch grids.
"""
import ast
import importlib
import inspect
import pkgutil

import gradpress.kernels.cuda as package


def _gpu_values(tree: ast.Module) -> dict:
    """name -> the GPU's value of every ``name = a if ...ENABLE_CUDASIM else b``."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.IfExp) and "ENABLE_CUDASIM" in ast.unparse(node.value.test):
            found[node.targets[0].id] = ast.literal_eval(node.value.orelse)
    return found


def _set(module, tree: ast.Module, values: dict) -> dict:
    """Give ``module`` the GPU's ``values`` and re-run its later constants that depend on
    them; returns every name changed, with its new value."""
    changed = dict(values)
    vars(module).update(values)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id not in values \
                and any(isinstance(n, ast.Name) and n.id in changed for n in ast.walk(node.value)):
            exec(compile(ast.Module([node], []), module.__file__, "exec"), vars(module))
            changed[node.targets[0].id] = getattr(module, node.targets[0].id)
    return changed


def use() -> dict:
    """Before any kernel runs. Returns {module name: {name: GPU value}} of what changed."""
    modules = [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    trees = {m.__name__: ast.parse(inspect.getsource(m)) for m in modules}
    changed = {}
    for m in modules:
        values = _gpu_values(trees[m.__name__])
        if values:
            changed[m.__name__] = _set(m, trees[m.__name__], values)
    # a module would miss a scaled value it had bound by ``from ... import``: rebind it (and
    # what the module derived from it)
    for m in modules:
        imported = {alias.asname or alias.name: changed[node.module][alias.name]
                    for node in trees[m.__name__].body if isinstance(node, ast.ImportFrom) and node.module in changed
                    for alias in node.names if alias.name in changed[node.module]}
        if imported:
            _set(m, trees[m.__name__], imported)
    assert {name.rsplit(".", 1)[1] for name in changed} >= {"topk_radix", "packing", "norms"}, \
        f"the simulator's block sizes moved: tests/support/gpu_block_sizes.py found only {sorted(changed)}"
    return changed
