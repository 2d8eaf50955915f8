"""``choir gate``: may this tree (or commit) merge? Fail closed, say who vouched.

The answer is yes only when the work item has a live ASSERT for exactly the tree in question
and every attestation behind it re-verifies now (id, signature, stored evidence) and was
signed by a pinned trusted key (``choir.attest.trust_root``). Without ``--repo`` the tree is
the current directory's: a gate that checked nothing would pass any tree.
With ``--commit``, the ASSERT must name that commit, which Choir records only when the
verified tree was exactly that commit's tree, and, when the repo is at hand, be for
the tree git holds for that commit.

The ASSERT is looked up in the signed log, never in the store's tables (a cache anyone who
writes the database can edit): the chain re-hashed, the events up to the latest head a
pinned key signed replayed through the write rules (``choir.ahdb.signed``). Any event past
that head (written without the key) closes the gate.

Before any of that, the store must not have been rolled back behind a head this machine
has seen (``choir.ahdb.anchor``): a high-water mark per store kept outside the home
(``SeenHeads``), and a pinned head given with ``--expect-head``. A log that no longer reaches
or no longer contains one is refused; otherwise the mark moves up to the latest trusted
signed head, never onto an event no trusted key signed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from choir.ahdb import AHDB
from choir.ahdb.anchor import Mark, PinnedHead, SeenHeads, follow
from choir.ahdb.heads import head_key_id
from choir.ahdb.rules import live_assert
from choir.ahdb.signed import SignedLog, read_signed
from choir.ahdb.store import claim_text, done_text
from choir.attest import AttestationStore, signer_counts, trust_root, verify_attestation
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.tree import commit_tree_hash, resolve_commit, tree_hash
from choir.exceptions import IntegrityError, UserError
from choir.models import Atom, AtomKind, AtomStatus, Result


@dataclass
class GateAnswer:
    """The gate's verdict, the key ids that signed, and why not when it is no."""

    passed: bool
    work_item: str
    tree_hash: str | None
    commit_sha: str | None
    signers: dict[str, int] = field(default_factory=dict)
    trust: str = ""
    first_use: bool = False
    problems: list[str] = field(default_factory=list)
    attestations: list[str] = field(default_factory=list)
    """The ids of the attestations behind the ASSERT that the gate loaded and judged."""
    recorded_by: str = ""
    """What wrote the ASSERT: ``choir run`` (a work item's run), ``a claim`` (``choir verify
    --claim`` or an agent's verify over MCP, in the mood it chose), or ``choir plan run``."""


def gate_target(repo: Path | None, commit: str | None,
                cwd: Path | None = None) -> tuple[str | None, str | None]:
    """(tree hash, full commit sha) to gate: ``check_gate``'s ``tree`` and ``commit``.

    Without ``commit``: ``repo``'s working tree, else the current directory's. With
    ``commit`` and a repo to read it from (``repo``, or a git current directory): that
    commit's tree, computed from git's objects, so an ASSERT recorded for another tree under
    the same sha cannot pass; the sha is kept beside it only when the commit holds submodule
    entries, which the tree hash leaves out (only an ASSERT of that very commit answers for
    them). A commit whose ``.gitattributes`` converts files on checkout (``ident``, a
    ``filter``, a ``working-tree-encoding``, ``eol=crlf``) is refused: the tree hash is of
    the bytes git stores, and a checkout of it holds others (review 18b). With ``commit``
    and no repo: the commit alone (Choir records a commit only for a tree that was exactly
    it).

    Raises:
        UserError: no tree can be determined (not a directory; the current directory is
            not a git work tree nor a repo with ``choir.yaml``), the commit is unknown, or a
            checkout of it converts its files.
    """

    fix = "run `choir gate` at the root of the verified repo, or pass --repo DIR or --commit SHA"
    if repo is not None and not repo.is_dir():
        raise UserError(f"gate: {repo} is not a directory\n  fix: {fix}")
    here = (repo or cwd or Path.cwd()).resolve()
    is_git = (here / ".git").exists()
    if commit is not None:
        if not is_git:
            if repo is not None:
                raise UserError(f"gate: {here} is not a git work tree, so commit {commit} "
                                f"cannot be read there\n  fix: {fix}")
            return None, commit
        full = resolve_commit(here, commit)
        tree = commit_tree_hash(here, full) if full else None
        if tree is None or full is None:
            raise UserError(f"gate: {commit} is not a commit in {here}\n  fix: fetch it, or "
                            "give the full sha of the commit that was verified")
        return tree, bound_commit(here, full)
    if repo is None and not is_git and not (here / "choir.yaml").is_file():
        raise UserError(
            f"gate: cannot tell which tree to check: {here} is neither a git work tree nor a "
            f"repo with choir.yaml\n  fix: {fix}")
    return tree_hash(here), None


def _converts(line: str) -> bool:
    """Whether a ``.gitattributes`` line sets (or defines a macro that sets) something a
    checkout changes the stored bytes by on this machine."""
    for word in line.split()[1:]:
        name, _, value = word.partition("=")
        if name == "ident" or (name in ("filter", "working-tree-encoding") and value) or \
                (name == "eol" and value.lower() == "crlf"):
            return True
    return False


def bound_commit(repo: Path, commit: str) -> str | None:
    """``commit`` when an ASSERT must name it (it holds submodule entries), else None; the
    gate's and ``choir promote``'s check of what a checkout of it would hold.

    Raises:
        UserError: its entries cannot be read, or a checkout of it converts its files.
    """
    from choir.evidence.tree import commit_outside

    read = commit_outside(repo, commit)
    if read is None:
        raise UserError(f"gate: commit {commit[:12]}'s submodule entries and .gitattributes "
                        f"files cannot be read in {repo}\n  fix: run `git fsck` there")
    submodules, attributes = read[0]
    converting = sorted(f"{path}: {line}" for path, lines in attributes.items()
                        for line in lines if _converts(line))
    if converting:
        raise UserError(
            f"gate: a checkout of commit {commit[:12]} converts its files "
            f"({'; '.join(converting)[:300]}): Choir verifies the bytes git stores, and a "
            "checkout of this commit holds others, so no verdict answers for it\n  fix: drop "
            "the ident, filter, working-tree-encoding and eol=crlf attributes, or gate the "
            "verified working tree itself (`choir gate WORK_ITEM --repo DIR`)")
    return commit if submodules else None


def check_anchors(ahdb: AHDB, trusted: set[str] | frozenset[str], *,
                  pin: PinnedHead | None = None, pin_source: str = "the pinned head",
                  seen: SeenHeads | None = None,
                  upto: tuple[int, str] | None = None) -> list[str]:
    """Why the store's log is not at or beyond every head this machine has seen; when it
    is, ``seen`` moves up to ``upto`` (the latest trusted signed head), else the log's head.

    Raises:
        ConfigError: the seen-heads file is malformed.
    """
    problems: list[str] = []
    marks: list[Mark] = []
    if pin is not None:
        key_id = head_key_id(pin.as_head())
        if key_id is None or key_id not in trusted:
            problems.append(f"{pin_source}: " + ("its signature does not hold" if key_id is None
                                                 else f"signed by untrusted key {key_id}"))
        marks.append(Mark(pin.seq, pin.head, pin_source))
    store = ahdb.identity()
    # marked by where the store is, and by which log it holds (its first event's hash): a
    # copy of the log from before, put anywhere (a link to it, another path, another
    # database), is the same log and is held to the same mark (review 16e)
    names = [store, *(f"log:{first}" for first in [ahdb.first_hash()] if first)]
    seen_marks = {name: mark for name in names if seen is not None
                  and (mark := seen.mark(name)) is not None}
    marks.extend(seen_marks.values())
    try:
        if marks:
            problems.extend(follow(ahdb.events(since=min(m.seq for m in marks)), marks))
        if not problems and seen is not None:
            seq, head = upto or ahdb.head()
            if seq:
                for name in names:
                    seen.advance(name, seq, head)
    except Exception as exc:  # fail closed: a log that cannot be read is refused
        problems.append(f"the AHDB log cannot be read: {type(exc).__name__}: {exc}"[:300])
    if seen_marks and problems and seen is not None:
        problems.append(f"if the store at {store} was reset on purpose, remove its entries "
                        f"({', '.join(seen_marks)}) from "
                        f"{seen.path}; a home copied from another shares that one's log and "
                        "its mark (copying a home is not supported: `choir init` a new one)")
    return problems


def run_wrote(signed: SignedLog, work_item: str) -> bool:
    """Whether the signed log holds atoms ``choir run`` wrote for ``work_item`` (its
    rounds' HYPOTHESIZE or HYPERTHESIS, or its ASSERT: ``AHDB.run_recorded``'s rule). A
    plan's ids (``PLAN.ITEM``) are left out: the plan records its own claims under them."""
    return "." not in work_item and any(
        atom.work_item == work_item and (atom.kind is not AtomKind.ASSERT or
                                         atom.claim == done_text(work_item))
        for atom in signed.state.atoms.values())


def _asserted(signed: SignedLog, work_item: str, runs_only: bool, tree_hash: str | None = None,
              commit_sha: str | None = None) -> Atom | None:
    """``signed.asserted``; with ``runs_only``, a run's ASSERT (``done_text``) only: a
    claim under a run's item id (an agent's verify over MCP during round 1, in the mood it
    chose: review 22b, F3) never answers for the item."""
    if not runs_only:
        return signed.asserted(work_item, tree_hash=tree_hash, commit_sha=commit_sha)
    candidates = [a for a in signed.state.atoms.values()
                  if a.kind is AtomKind.ASSERT and a.status is AtomStatus.PROMOTED and
                  a.work_item == work_item and a.claim == done_text(work_item) and
                  (not tree_hash or a.tree_hash == tree_hash)]
    return live_assert(signed.state, reversed(candidates), commit_sha)


def check_gate(work_item: str, *, tree: str | None, commit: str | None,
               pin: PinnedHead | None = None, pin_source: str = "the pinned head",
               seen: SeenHeads | None = None, opens: str | None = None) -> GateAnswer:
    """Re-verify the ASSERT for ``work_item`` at ``tree``/``commit``. See the module docstring.

    ``pin``: a head the log must contain (``--expect-head``); ``seen``: the high-water marks
    to check and move up (``SeenHeads.default_path()`` from the CLI). ``opens``: what opens
    this gate, said when it is shut (default: a claim's or a run's ASSERT; a plan's gate
    names ``choir plan run``, and then no claim on another tree is hinted at).

    Raises:
        ConfigError: the pinned trusted-key list or the seen-heads file is malformed.
    """

    root = trust_root()
    answer = GateAnswer(False, work_item, tree, commit, trust=root.describe(),
                        first_use=root.first_use)
    if tree is None and commit is None:  # never an unbounded question
        answer.problems.append("no tree and no commit to check")
        return answer
    store, atts = ArtifactStore(), AttestationStore()
    # the log is replayed with intact-evidence checks; trust is judged below, per attestation,
    # so the answer can name the key that signed even when it is not pinned
    try:  # the configured store (choir.config.store_url)
        ahdb = AHDB(attestations=atts, artifacts=store)
    except UserError:
        raise
    except Exception as exc:  # fail closed: a store that does not open vouches for nothing
        answer.problems.append(f"the AHDB cannot be opened: {type(exc).__name__}: {exc}"[:300])
        return answer
    try:
        signed = read_signed(ahdb, root.keys)
    except Exception as exc:  # fail closed: a log that cannot be read vouches for nothing
        signed = SignedLog((0, ""), problems=[
            f"the AHDB log cannot be read: {type(exc).__name__}: {exc}"[:300]])
    rolled_back = check_anchors(ahdb, root.keys, pin=pin, pin_source=pin_source, seen=seen,
                                upto=signed.head)
    if rolled_back or signed.problems:
        answer.problems.extend([*rolled_back, *signed.problems])
        return answer
    runs_only = run_wrote(signed, work_item)
    atom = _asserted(signed, work_item, runs_only, tree, commit)
    if atom is None or not atom.attestations:
        other = _asserted(signed, work_item, runs_only) if (tree or commit) and \
            opens is None else None
        if runs_only and signed.asserted(work_item, tree_hash=tree, commit_sha=commit):
            answer.problems.append(
                f"{work_item} is ASSERTed only by a claim (`choir verify --claim "
                f"{work_item}`, or an agent's verify over MCP, in the mood it chose), and "
                f"`choir run` has recorded rounds of the work item {work_item}: only a "
                "`choir run` ASSERT opens its gate")
        answer.problems.append(f"{work_item} is not ASSERTed" +
                               (" for that tree" if tree else "") +
                               (" for that commit" if commit else "") +
                               (" (its submodule entries are outside the tree hash: only a "
                                "claim made on a checkout of that very commit answers for "
                                "them)" if tree and commit else "") +
                               "; what opens the gate: " + (opens or (
                                   f"`choir run` of the work item {work_item} ending "
                                   "ASSERTed on exactly this tree" if runs_only else
                                   f"`choir verify --claim {work_item}` passing on exactly "
                                   f"this tree, or `choir run` of the work item {work_item} "
                                   "ending ASSERTed on it")))
        if other is not None:  # a claim made on a working tree that was not this commit's
            answer.problems.append(
                f"{work_item} is ASSERTed for another tree ({(other.tree_hash or '?')[:12]}): "
                "the one "
                "verified held changes or untracked files this tree lacks (`git status`; "
                "ignore build output such as *.egg-info/ in .gitignore), or was another "
                "commit's")
        return answer
    answer.recorded_by = ("choir run" if atom.claim == done_text(work_item) else
                          "a claim (choir verify --claim, or an agent's verify over MCP)"
                          if atom.claim == claim_text(work_item) else "choir plan run")
    loaded = []
    for att_id in atom.attestations:
        try:
            att = atts.get(att_id)
        except (IntegrityError, OSError, ValueError) as err:
            answer.problems.append(f"attestation {att_id[:12]}: unreadable: {err}")
            continue
        loaded.append(att)
        for v in verify_attestation(att, artifacts=store, trusted_keys=root.keys,
                                    revoked_keys=root.revoked):
            answer.problems.append(f"attestation {att_id[:12]}: {v.kind}: expected "
                                   f"{v.expected}, found {v.found}")
        target = att.body.target
        if att.body.result is not Result.PASS or target.tree_hash != atom.tree_hash or \
                (tree and target.tree_hash != tree) or (commit and target.commit_sha != commit):
            answer.problems.append(f"attestation {att_id[:12]}: not a PASS for this tree")
    answer.signers = signer_counts(loaded)
    answer.attestations = [att.id for att in loaded]
    answer.passed = not answer.problems and bool(loaded)
    return answer
