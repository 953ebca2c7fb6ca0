"""dsv4spec.properties: the conformance checks, one module a family, and the comparisons they share.

The runner that once lived here is dsv4spec.runner (docs/HOUSE.md); its modules keep their old
names, `dsv4spec.properties.target` and the rest (MOVED), as the very module under the new name."""
import importlib
import importlib.abc
import importlib.util
import sys

MOVED = ("adapters", "causes", "contract", "coverage", "entries", "exec_target", "merge", "plugin",
         "pytest_guard", "report", "shard", "suite", "target", "workers")


class _OldName(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `dsv4spec.properties.<moved>[.sub]` as `dsv4spec.runner.<moved>[.sub]` itself: one
    module object under both names, so that its state, its classes and a patch of it are shared."""

    def find_spec(self, name, path=None, target=None):
        head, _, rest = name.partition(__name__ + ".")
        if not head and rest.split(".")[0] in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def exec_module(self, module):
        moved = "dsv4spec.runner." + module.__name__.removeprefix(__name__ + ".")
        sys.modules[module.__name__] = importlib.import_module(moved)


if not any(isinstance(finder, _OldName) for finder in sys.meta_path):
    sys.meta_path.insert(0, _OldName())
