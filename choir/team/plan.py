"""The plan file: members, work items with dependencies, validated whole with lines.

A plan is loaded like ``choir.yaml``: every mistake (an unknown member, an item with neither
``executor:`` nor ``member:``, a dependency on a missing id, a cycle named with its path) is
reported at once with file, line and fix, before anything runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from choir.config._yaml import YamlDoc, load_yaml, validation_errors
from choir.config.agents import expand_keys, expand_plan
from choir.exceptions import ConfigError
from choir.models import Mood
from choir.models._base import Frozen
from choir.models.workitem import ExecutorSpec, WorkItem

_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Member(Frozen):
    """A named executor the plan's items may hand their work to."""

    executor: ExecutorSpec
    mood: Mood | None = None
    concurrency: int = Field(default=1, ge=1, le=64)


class PlanItem(WorkItem):
    """A work item as today, with ``repo`` taken from the plan, plus who does it, who takes
    it over when the loop cannot satisfy it (``escalate_to``: a member of the plan, an
    executor, or ``human``), and what it waits for."""

    repo: str = ""
    executor: ExecutorSpec | None = None  # type: ignore[assignment]
    member: str | None = None
    escalate_to: ExecutorSpec | str | None = None  # type: ignore[assignment]
    depends_on: tuple[str, ...] = ()


class Budget(Frozen):
    """What the whole plan may spend; once any limit is reached no further item starts (the
    ones running finish; the rest are reported blocked). Each item's own run is bounded
    by its ``max_attempts`` (one budget for it and every part split from it)."""

    attempts: int | None = Field(default=None, ge=1)  # item runs the driver starts
    tokens: int | None = Field(default=None, ge=1)  # prompt + completion, every member
    cost_usd: float | None = Field(default=None, gt=0)
    wall_s: float | None = Field(default=None, gt=0)  # from the plan's first start


class Plan(Frozen):
    """A validated plan; ``repo`` is absolute once loaded."""

    schema_version: int = 1
    id: str = Field(pattern=_ID)
    repo: str = "."
    base: str = "main"
    members: dict[str, Member] = Field(default_factory=dict)
    max_parallel: int = Field(default=2, ge=1, le=64)
    budget: Budget = Field(default_factory=Budget)
    items: tuple[PlanItem, ...] = ()
    items_from: str | None = None  # a folder of work item files (*.yaml), relative to the plan

    @field_validator("id")
    @classmethod
    def _no_dot(cls, value: str) -> str:
        """An item's claim is ``PLAN.ITEM`` (``item_key``): a plan ``p.x`` would share its
        claim, its gate and its ASSERTs with plan ``p``'s item ``x``."""
        if "." in value:
            raise ValueError(f"a plan id may not contain '.' (an item's claim is named "
                             f"PLAN.ITEM, so plan '{value}' would answer for the item "
                             f"'{value.split('.', 1)[1]}' of plan '{value.split('.', 1)[0]}'); "
                             f"name it e.g. '{value.replace('.', '-')}'")
        return value

    def item(self, item_id: str) -> PlanItem:
        return next(i for i in self.items if i.id == item_id)

    def integration_mood(self) -> Mood:
        """The mood of every integration round: the strictest any of the plan's items runs
        in (``STRICTNESS``), so two verified changes are checked together by every verifier
        that checked either. The rounds ran CALM, whatever the items' moods: two SKEPTICAL
        items that each passed an integration test alone but broke it together merged."""
        moods = {self.work_item(item.id, Path(self.repo)).mood for item in self.items}
        return max(moods, key=STRICTNESS.index, default=Mood.CALM)

    def work_item(self, item_id: str, repo: Path) -> WorkItem:
        """The item as a plain work item over ``repo`` (its worktree), its executor resolved
        from its member, under a plan-qualified id so two plans never share an ASSERT."""
        item = self.item(item_id)
        member = self.members.get(item.member or "")
        executor = item.executor or (member.executor if member else None)
        data = item.model_dump(exclude={"member", "depends_on", "executor", "repo", "id",
                                        "escalate_to"}, exclude_unset=True)
        if member is not None and member.mood is not None and "mood" not in data:
            data["mood"] = member.mood
        target = item.escalate_to
        if isinstance(target, str) and target in self.members:  # a member: its executor
            data["escalate_to"] = self.members[target].executor
        elif target is not None:
            data["escalate_to"] = target
        return WorkItem(id=item_key(self.id, item.id), repo=str(repo),
                        executor=executor or ExecutorSpec(), **data)


# the packaged moods by what they verify (policies/moods.yaml: CALM within CURIOUS within
# SKEPTICAL within BOLD once it broadens, within PARANOID)
STRICTNESS = (Mood.CALM, Mood.CURIOUS, Mood.SKEPTICAL, Mood.BOLD, Mood.PARANOID)


def item_key(plan_id: str, item_id: str) -> str:
    """The AHDB work item id of one plan item."""
    return f"{plan_id}.{item_id}"


def _cycle(deps: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A dependency cycle as a path (first id repeated at the end), or None.

    Depth first with a stack of its own, not Python's: a chain of a thousand items (a
    plan well under the size cap) exceeded the interpreter's recursion limit (review 16c).
    """
    state: dict[str, int] = {}
    for root in deps:
        if state.get(root) is not None:
            continue
        state[root] = 1
        path, todo = [root], [iter(deps.get(root, ()))]
        while todo:
            dep = next(todo[-1], None)
            if dep is None:  # every dependency of path[-1] explored
                state[path.pop()] = 2
                todo.pop()
            elif state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            elif dep in deps and state.get(dep) is None:
                state[dep] = 1
                path.append(dep)
                todo.append(iter(deps.get(dep, ())))
    return None


# where each item was written: its file, and the path of its mapping in that file
Where = tuple[YamlDoc, tuple[str | int, ...]]


def _folder_items(path: Path, doc: YamlDoc, plan: Plan) -> tuple[list[PlanItem], list[Where],
                                                                  list[ConfigError]]:
    """The work item files of ``items_from``, each validated with its own file and lines."""
    folder = (path.parent / (plan.items_from or "")).resolve()
    if not folder.is_dir():
        return [], [], [ConfigError(f"items_from '{plan.items_from}' is not a folder "
                                    f"(resolved to {folder})", path=str(path),
                                    line=doc.line_of(("items_from",)),
                                    hint="items_from is relative to the plan file")]
    items: list[PlanItem] = []
    where: list[Where] = []
    errors: list[ConfigError] = []
    for file in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        item_doc = load_yaml(file)
        data, _, found = expand_keys(item_doc, item_doc.data, ())
        parsed, more = validation_errors(item_doc, PlanItem, data)
        errors += found + more
        if parsed is not None:
            items.append(parsed)
            where.append((item_doc, ()))
    return items, where, errors


# an item's run ids are PLAN.ITEM.ATTEMPT (and a split part's longer), at most 100 characters
_IDS_MAX = 80


def _id_problem(plan_id: str, item_id: str) -> tuple[str, str] | None:
    """What is wrong with a plan item's id beyond its pattern, and the fix: it names a git
    branch (``choir/plan/PLAN/item/ITEM``), files and run ids, and ``~`` is a split part's."""
    if "~" in item_id:
        return ("holds '~', which only the parts of a split item carry (ITEM~1)",
                f"use '-' instead, e.g. '{item_id.replace('~', '-')}'")
    if not _ref_ok(item_id):
        return ("cannot name a git branch (choir/plan/PLAN/item/ID): it holds '..' or ends "
                "with '.' or '.lock'", "drop those dots")
    if len(plan_id) + len(item_id) > _IDS_MAX:
        return (f"is too long beside the plan id '{plan_id}' (their run ids hold both: "
                f"{_IDS_MAX} characters together at most)", "shorten the item or the plan id")
    return None


def _ref_ok(name: str) -> bool:
    """Whether git takes ``name`` in a ref (check-ref-format's rules for the characters a
    plan's names may hold): no ``..``, no part empty, starting with ``.`` or ending with
    ``.lock``, and no ``.`` at the end."""
    return ".." not in name and not name.endswith(".") and all(
        p and not p.startswith(".") and not p.endswith(".lock") for p in name.split("/"))


def _base_ok(base: str) -> bool:
    """A branch name git takes, in the subset a plan's base may use."""
    return bool(re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$", base)) and _ref_ok(base)


def _graph_errors(plan: Plan, where: list[Where]) -> list[ConfigError]:
    errors: list[ConfigError] = []
    ids = [i.id for i in plan.items]
    for n, item in enumerate(plan.items):
        doc, loc = where[n]
        path = str(doc.path)
        problem = _id_problem(plan.id, item.id)
        if problem:
            errors.append(ConfigError(f"item id '{item.id}' {problem[0]}", path=path,
                                      line=doc.line_of((*loc, "id")), hint=problem[1]))
        if ids.count(item.id) > 1 and ids.index(item.id) != n:
            errors.append(ConfigError(f"item id '{item.id}' is used twice", path=path,
                                      line=doc.line_of((*loc, "id")),
                                      hint="give every item its own id"))
        if item.member is not None and item.member not in plan.members:
            known = ", ".join(sorted(plan.members)) or "(none: add a 'members:' section)"
            errors.append(ConfigError(f"item '{item.id}' names unknown member "
                                      f"'{item.member}'", path=path,
                                      line=doc.line_of((*loc, "member")),
                                      hint=f"use one of: {known}"))
        if (item.member is None) == (item.executor is None):
            errors.append(ConfigError(f"item '{item.id}' needs exactly one of 'executor:' "
                                      "and 'member:'", path=path, line=doc.line_of(loc),
                                      hint="name a member of the plan, or give an executor"))
        target = item.escalate_to
        if isinstance(target, str) and target != "human" and target not in plan.members:
            known = ", ".join(sorted(plan.members)) or "(none: add a 'members:' section)"
            errors.append(ConfigError(f"item '{item.id}' escalates to unknown member "
                                      f"'{target}'", path=path,
                                      line=doc.line_of((*loc, "escalate_to")),
                                      hint=f"use one of: {known}, or human"))
        for k, dep in enumerate(item.depends_on):
            if dep not in ids:
                errors.append(ConfigError(f"item '{item.id}' depends on missing item "
                                          f"'{dep}'", path=path,
                                          line=doc.line_of((*loc, "depends_on", k)),
                                          hint=f"use one of: {', '.join(ids)}"))
    cycle = _cycle({i.id: i.depends_on for i in plan.items})
    if cycle:
        doc, loc = where[ids.index(cycle[0])]
        errors.append(ConfigError(f"dependency cycle: {' -> '.join(cycle)}",
                                  path=str(doc.path), line=doc.line_of((*loc, "depends_on")),
                                  hint="drop one of these depends_on entries"))
    return errors


def load_plan(path: Path) -> Plan:
    """Load a plan file; ``repo`` is resolved relative to it and must be a git repo.

    Raises:
        ConfigError: every mistake in the file (ConfigErrors when several).
    """
    path = path.expanduser().resolve()
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise ConfigError("a plan must be a mapping", path=str(path), line=1,
                          hint="start with 'id: my-plan'")
    data, errors = expand_plan(doc)  # ``uses: claude-code`` under an executor
    parsed, found = validation_errors(doc, Plan, data)
    errors += found
    if parsed is None:
        ConfigError.raise_all(errors)
    plan: Plan = parsed
    where: list[Where] = [(doc, ("items", n)) for n in range(len(plan.items))]
    if plan.items_from is not None:
        extra, extra_where, found = _folder_items(path, doc, plan)
        errors += found
        plan = plan.model_copy(update={"items": (*plan.items, *extra)})
        where += extra_where
    if not plan.items:
        errors.append(ConfigError("the plan has no items", path=str(path), line=1,
                                  hint="add 'items:', or 'items_from: FOLDER' of work item "
                                  "files"))
    errors += _graph_errors(plan, where)
    repo = (path.parent / plan.repo).resolve()
    if not (repo / ".git").exists():
        errors.append(ConfigError(f"repo '{plan.repo}' is not a git repository "
                                  f"(resolved to {repo})", path=str(path),
                                  line=doc.line_of(("repo",)),
                                  hint="repo is relative to the plan file"))
    if not _base_ok(plan.base):
        errors.append(ConfigError(f"base '{plan.base}' is not a branch name", path=str(path),
                                  line=doc.line_of(("base",)), hint="e.g. base: main"))
    ConfigError.raise_all(errors)
    return plan.model_copy(update={"repo": str(repo)})
