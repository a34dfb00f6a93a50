"""Every kind of check, declared in one place: what a check of the kind must set, what its params must hold, the
engine module that decides it, and the hint a hidden check of it shows. A new kind is one entry here and one
module beside grader/verify/kinds/value.py exposing evaluate(judge, check, runs).

    static    an operation is reached from the entry function (or, with forbid, none of them is): decided by
              the static analysis (verify/score.py) and the runs' overrule (verify/overrule.py)
    value     a quantity at a world size, right on every rank and derived from what the communication delivered
    uses      at a world size, the quantities came through their operations and no forbidden operation ran
    traffic   at a world size, point-to-point exchanges form the declared pattern (params: "pattern": "ring",
              "sends", "volume" ...)
    counts    how many times `op` completed per rank (params: "count", "per", "at_most", "quantities")
    volume    the dtypes every `op` carried and the bytes a rank sent in them (params: "dtypes", "bytes",
              "quantities")
    groups    which ranks each operation spans, with nodes of params["node"] consecutive ranks (params: "inside",
              "quantities")
traffic, counts, volume and groups count for a correct answer only: they pass where the check's quantity
passes its value check at the same world size. Counts, volume and groups judge the operations that carried
the quantity's elements (verify/kinds/measured.py), whatever their size; params["quantities"] names the
quantities whose operations are judged where it is more than the check's own (a step's every all-reduce).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .validate import DeclarationError, dtypes, ops


@dataclass(frozen=True)
class Kind:
    name: str
    needs: tuple[str, ...]                   # fields a check must set besides id, points and title ("a|b": either)
    evaluator: str | None                    # the module of grader/verify/kinds/ that decides it (None: static)
    hint: str | None = None                  # what a hidden check says when it fails on a right value
    params: Callable | None = None           # params(check): raises DeclarationError on what cannot work


def _known(check, names: tuple[str, ...]) -> None:
    """Params the kind does not read are a mistake of the declaration (a misspelt key would be ignored)."""
    for key in check.params:
        if key not in names:
            raise DeclarationError("declare.params", check.where, id=check.id, field=f"params[{key!r}]",
                                   value=f"(not a param of {check.kind}: {', '.join(names)})")


def _quantities(check) -> None:
    """params["quantities"]: names of quantities (each checked against the exercise's at load, spec.py)."""
    names = check.params.get("quantities")
    if names is not None and (isinstance(names, str) or not isinstance(names, (tuple, list)) or not names
                              or not all(isinstance(n, str) for n in names)):
        raise DeclarationError("declare.params", check.where, id=check.id, field='params["quantities"]',
                               value=repr(names)[:80])


def _counts(check) -> None:
    _known(check, ("count", "per", "at_most", "quantities"))
    _quantities(check)
    p, where, cid = check.params, check.where, check.id
    count = p.get("count")
    if not (callable(count) or (isinstance(count, int) and not isinstance(count, bool) and count >= 0)):
        raise DeclarationError("declare.params", where, id=cid, field='params["count"]', value=repr(count))
    if p.get("per", "rank") not in ("rank", "all"):
        raise DeclarationError("declare.params", where, id=cid, field='params["per"]', value=repr(p.get("per")))


def _volume(check) -> None:
    _known(check, ("dtypes", "bytes", "quantities"))
    _quantities(check)
    p, where, cid = check.params, check.where, check.id
    allowed = p.get("dtypes")
    if not isinstance(allowed, (tuple, list)) or not allowed:
        raise DeclarationError("declare.params", where, id=cid, field='params["dtypes"]', value=repr(allowed))
    dtypes(f"Check({cid!r}).params['dtypes']", allowed, where)
    if "bytes" in p and not callable(p["bytes"]):
        raise DeclarationError("declare.params", where, id=cid, field='params["bytes"]', value=repr(p["bytes"])[:80])


def _groups(check) -> None:
    _known(check, ("node", "inside", "quantities"))
    _quantities(check)
    p, where, cid = check.params, check.where, check.id
    node = p.get("node")
    if isinstance(node, bool) or not isinstance(node, int) or node < 1:
        raise DeclarationError("declare.params", where, id=cid, field='params["node"]', value=repr(node))
    if check.world_size and check.world_size % node:
        raise DeclarationError("declare.params", where, id=cid, field='params["node"]',
                               value=f"{node} (does not divide the world size {check.world_size})")
    ops(f"Check({cid!r}).params['inside']", tuple(p.get("inside") or ()), where)


KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("static", ("op|forbid",), None),
    Kind("value", ("world_size", "quantity"), "grader.verify.kinds.value"),
    Kind("uses", ("world_size",), "grader.verify.kinds.uses"),
    Kind("traffic", ("world_size", "quantity"), "grader.verify.kinds.traffic", "hint.wrong_traffic"),
    Kind("counts", ("world_size", "op"), "grader.verify.kinds.counts", "hint.wrong_counts", _counts),
    Kind("volume", ("world_size", "op", "quantity"), "grader.verify.kinds.volume", "hint.wrong_volume", _volume),
    Kind("groups", ("world_size", "quantity"), "grader.verify.kinds.groups", "hint.wrong_groups", _groups),
)}


def check_params(check) -> None:
    """The params a check sets, against what its kind reads (checked at load)."""
    if not isinstance(check.params or {}, dict):
        raise DeclarationError("declare.params", check.where, id=check.id, field="params", value=repr(check.params)[:80])
    kind = KINDS[check.kind]
    if kind.params is not None:
        kind.params(check)
