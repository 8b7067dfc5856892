"""Import contract types of our own, for import-linter (``[tool.importlinter]`` in
``pyproject.toml``, ``contract_types``; ``make lint`` runs them with the built-in ones).

``private_modules``: a private module (a dotted name with a part starting with ``_``,
such as ``strata.client._accumulator`` or ``wire.schema._convert``; ``__init__`` and
``__main__`` are not private) is imported only from inside its own top-level package.
Another package uses what the owner exports: its ``__init__``'s ``__all__`` or a public
module. import-linter's own contracts cannot say this: their module expressions match
whole names (``strata.client.*``), not names starting with ``_``, so a ``forbidden`` or
``protected`` contract would have to list every private module, and a new one would go
unchecked.

Options: ``packages``, the top-level packages whose private modules are protected;
``ignore_imports``, imports let through (``importer -> imported``, as in the built-in
contracts; one that no longer exists is an error, so a fixed import cannot leave its
exception behind).

Not installed with the package: import-linter imports this module from the working
directory, the repository root.
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils

__all__ = ["PrivateModulesContract", "is_private"]


def is_private(module: str) -> bool:
    """Whether a part of ``module``'s dotted name below its top level starts with ``_``
    (dunder names such as ``__main__`` excepted)."""
    return any(part.startswith("_") and not part.startswith("__")
               for part in module.split(".")[1:])


class PrivateModulesContract(Contract):
    """No module imports a private module of another top-level package."""

    type_name = "private_modules"

    packages = fields.ListField(subfield=fields.ModuleField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph, ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=contract_utils.AlertLevel.ERROR)
        protected = {module.name for module in self.packages}  # type: ignore[attr-defined]
        illegal: list[dict[str, Any]] = []
        for importer in sorted(graph.modules):
            home = importer.split(".")[0]
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                owner = imported.split(".")[0]
                if owner == home or owner not in protected or not is_private(imported):
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                illegal.append({"importer": importer, "imported": imported,
                                "line_numbers": [d["line_number"] for d in details]})
        return ContractCheck(kept=not illegal, warnings=list(removal.warnings),
                             ignored_import_count=removal.ignored_import_count,
                             metadata={"illegal": illegal})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for link in check.metadata["illegal"]:
            lines = ", ".join(f"l.{n}" for n in link["line_numbers"])
            output.print_error(f"{link['importer']} -> {link['imported']} ({lines})",
                               bold=False)
        output.new_line()
        output.print("Import what the owning package exports (its __all__ or a public "
                     "module); export it there if it is missing.")
