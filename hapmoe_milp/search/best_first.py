"""The exact solvers' best-first search over sub-problems and depths, with a shared incumbent.

:mod:`hapmoe_milp.search.exact` builds the sub-problems and reads the answer; this module decides which
node to work on next and what has been proved about each.

Every node (a sub-problem, then a depth) carries a valid lower bound: a sub-problem starts with the DP's
root bound (an interleaved copy with its quick bound, ``SubProblem.quick_bound``, raised to the root bound
when it comes first); a depth model's bound comes from its reductions (covering bound on ``tau_max`` and
the other lower-bound cuts); a backend run raises it. The node with the smallest bound goes next; a node
whose bound reaches the incumbent is closed without a model; a depth model is built under the incumbent
as its cutoff, so the reductions shrink it as the incumbent improves, and a model the backend finds
infeasible is proven no better than the cutoff. With a time limit each backend run gets a time slice
that doubles when the node comes back, so the node holding the global bound down is the one that gets
the time. The global bound is the minimum over open nodes (and the incumbent), a valid lower bound
whatever the time limit.

Cold start (no incumbent, e.g. no plan handed in). Depth models are built without a cutoff, in bound
order, only to order the search; the first plan comes from the *small* depth model (at most
:data:`SMALL_ARCS` arcs, which a backend proves in milliseconds) with the smallest bound among the first
:data:`COLD_SMALL` small ones built. A large model is set aside meanwhile: a backend run on it takes
seconds and, with no cutoff to shrink it, often ends with no plan at all (Mixtral-L on 32 GPUs with
optimizer offload spent 10-20 s that way). Only the order changes, never what is proved: a node set aside
stays open, its bound counts in the global bound, and it goes back to the heap with the first plan.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from hapmoe_milp.plan import Plan
from hapmoe_milp.search import backends
from hapmoe_milp.search.block_bounds import BlockBounds
from hapmoe_milp.search.depth_model import DepthModel
from hapmoe_milp.search.formulation import Assignment, SubProblem, SubResult, evaluate_assignment, plan_of
from hapmoe_milp.search.range_bounds import RangeBounds
from hapmoe_milp.search.solution import Progress, ProgressEvent

log = logging.getLogger(__name__)

#: First time slice of a backend run, as a fraction of the time left (doubled on every return).
FIRST_SLICE = 0.25
#: ... and while there is no incumbent at all (a cold start), so that a first plan comes quickly.
COLD_SLICE = 0.03
MIN_SLICE_S = 0.5
#: With no incumbent, depth models are built without a cutoff (no reductions but their bounds) only to
#: order the search; once this many are built, or :data:`COLD_SMALL` small ones, the first plan is taken
#: (:meth:`Search.cold_pick`) and the rest are built under its cutoff. The order only, never what is proved.
COLD_MODELS = 100
#: A depth model of at most this many arcs is "small": a backend proves it in milliseconds, and its
#: optimum is a plan; the first plan comes from the small one with the smallest bound (Table 1's largest
#: depth models have 500-1,900 arcs and its one-mesh megatron ones 2-130).
SMALL_ARCS = 150
COLD_SMALL = 10
PROGRESS_EVERY_S = 0.2
#: Share of the time left that the range bounds of one sub-problem may take (:mod:`range_bounds`).
RANGE_SHARE = 0.25


@dataclass(eq=False)
class Node:
    sub: SubProblem
    P: int | None  # None: the whole sub-problem, not split by depth yet
    bound: float
    model: DepthModel | None = None
    tries: int = 0
    closed: bool = False
    how: str = ""
    last: SubResult | None = None
    hint: Assignment | None = None
    registered: bool = False


class Search:
    """State of one exact solve: nodes, incumbent, counters."""

    def __init__(
        self, solver: str, mod: backends.Backend, deadline: float | None, progress: Progress | None, block: bool = False
    ) -> None:
        self.solver = solver
        self.block = block
        self.block_s = 0.0
        self.range_s = 0.0
        self.mod = mod
        self.deadline = deadline
        self.progress = progress
        self.t0 = time.perf_counter()
        self.best_val = math.inf
        self.best_plan: Plan | None = None
        self.heap: list[tuple[float, int, Node]] = []
        self.nodes: list[Node] = []
        self.seq = 0
        self.counts = dict.fromkeys(
            (
                "closed_by_root_bound",
                "closed_by_block_bounds",
                "raised_by_range_bounds",
                "closed_by_reductions",
                "closed_by_solver",
                "solver_calls",
                "depth_models",
            ),
            0,
        )
        self.unmodelled: list[Node] = []
        self.relaxed: list[Node] = []  # relaxed depth models solved to optimality: bounds, not closed
        self.max_arcs = 0
        self.cold_models = 0  # depth models built with no incumbent (no cutoff) ...
        self.cold_best: Node | None = None  # ... and the one of them to solve first (:func:`_cold_key`)
        self.cold_small = 0  # ... of which small (:data:`SMALL_ARCS`)
        self.parked: list[Node] = []  # large cold models set aside until the first plan
        self.cold_done = False
        self.tolerance_s = 0.0
        self.resolution_s = 0.0
        self.bound_by_solver = False
        self._last_emit = 0.0

    def push(self, node: Node) -> None:
        self.seq += 1
        if not node.registered:
            node.registered = True
            self.nodes.append(node)
        heapq.heappush(self.heap, (node.bound, self.seq, node))

    def offer(self, sub: SubProblem, assignment: Assignment) -> None:
        val, fits = evaluate_assignment(sub, assignment)
        if not fits:  # cannot happen: arcs exist only if they fit; never return a plan that OOMs
            log.warning("%s: decoded plan does not fit memory; discarded", self.solver)
        elif val < self.best_val:
            self.best_val, self.best_plan = val, plan_of(sub, assignment)

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def global_bound(self) -> float:
        """Min over every node's bound (split sub-problems are represented by their depths)."""
        return min([self.best_val, *(n.bound for n in self.nodes if n.how != "split")])

    def emit(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if not force and now - self._last_emit < PROGRESS_EVERY_S:
            return
        self._last_emit = now
        total = sum(1 for n in self.nodes if n.P is not None) or len(self.nodes)
        done = sum(1 for n in self.nodes if n.closed and n.P is not None)
        limit = None if self.deadline is None else self.deadline - self.t0
        self.progress(
            ProgressEvent(
                phase=self.solver,
                done=done,
                total=total,
                best_s=self.best_val,
                elapsed_s=now - self.t0,
                limit_s=limit,
                bound_s=self.global_bound(),
            )
        )

    def close(self, node: Node, how: str, bound: float | None = None) -> None:
        node.closed = True
        node.how = how
        if bound is not None:
            node.bound = max(node.bound, bound)

    def run(self, solve_kw: dict[str, Any]) -> None:
        while self.heap or self.parked:
            if self.left() <= 0.05:
                break
            if self.parked and (not self.heap or math.isfinite(self.best_val)):
                self.unpark()
            bound, _, node = heapq.heappop(self.heap)
            built = False
            if node.closed or bound < node.bound:
                continue  # stale entry: a newer one carries the node's current bound
            if node.bound >= self.best_val:
                self.close(node, "root bound" if node.P is None or node.model is None else "bound")
                if node.P is None or node.model is None:
                    self.counts["closed_by_root_bound"] += 1
                continue
            if node.P is None and not node.sub.root_exact:
                # it started from its quick bound (interleaved copies): the full root bound first
                node.bound = max(node.bound, node.sub.root_bound)
                self.push(node)
                continue
            if node.P is None:  # split the sub-problem by depth
                self.split(node)
                continue
            if node.model is None or node.model.cutoff > self.best_val:
                dm = DepthModel(node.sub, node.P, self.best_val)
                self.counts["depth_models"] += node.model is None
                node.model = dm
                if dm.unmodelled:
                    node.bound = max(node.bound, dm.bound)
                    self.unmodelled.append(node)
                    continue  # stays open: its bound counts, nothing can solve it
                if dm.closed:
                    self.counts["closed_by_reductions"] += 1
                    self.close(node, "reductions", dm.cutoff)
                    self.emit()
                    continue
                node.bound = max(node.bound, dm.bound)
                built = True
                if math.isfinite(dm.cutoff) and self.heap and self.heap[0][0] < node.bound:
                    self.push(node)  # another node is more promising now
                    continue
            if not math.isfinite(self.best_val):
                pick = self.cold_pick(node, built)
                if pick is None:
                    continue
                node = pick
            self.solve_node(node, solve_kw)
            self.emit()

    def cold_pick(self, node: Node, built: bool) -> Node | None:
        """With no incumbent: the node to solve now for a first plan, or None (``node`` waits). Until
        :data:`COLD_SMALL` small depth models (:data:`SMALL_ARCS`) or :data:`COLD_MODELS` in all are built
        without a cutoff, the search keeps to bound order and solves only a small model that is still the
        most promising (a large one is set aside: its backend run would take seconds and may end with no
        plan); then the unsolved small one with the smallest bound is solved (any, if none is small).
        Only the order changes, never what is proved: a node set aside stays open (its bound counts) and
        goes back to the heap with the first plan, or when nothing else is left."""
        assert node.model is not None
        if built:
            self.cold_models += 1
            self.cold_small += len(node.model.slot) <= SMALL_ARCS
        best = self.cold_best
        done = best is not None and (best.closed or (best.last is not None and best.last.status == "optimal"))
        if best is None or done or _cold_key(node) < _cold_key(best):  # a relaxed optimum is not solved again
            best = self.cold_best = node
        if not self.cold_done and self.cold_small < COLD_SMALL and self.cold_models < COLD_MODELS:
            if self.heap and self.heap[0][0] < node.bound:
                self.push(node)
            elif len(node.model.slot) > SMALL_ARCS:
                self.parked.append(node)
            else:
                return node
            return None
        self.unpark()
        if best is not node:
            self.push(node)
        return best

    def unpark(self) -> None:
        """End the cold phase: the nodes set aside by :meth:`cold_pick` go back to the heap."""
        self.cold_done = True
        for n in self.parked:
            self.push(n)
        self.parked.clear()

    def split(self, node: Node) -> None:
        """Replace a sub-problem node by one node per depth; at scale each depth starts from its block
        bound under the incumbent, and a depth whose block bound reaches it is closed without a model."""
        node.closed = True
        node.how = "split"
        lbs: dict[int, float] = {}
        if self.block and BlockBounds.applicable(node.sub) and self.left() > MIN_SLICE_S:
            t0 = time.perf_counter()
            bb = BlockBounds(node.sub)
            lbs = bb.depth_bounds(self.best_val, self.deadline)
            self.block_s += time.perf_counter() - t0
            open_ = [P for P, lb in lbs.items() if lb < self.best_val]
            if RangeBounds.affordable(node.sub, open_) and self.left() > MIN_SLICE_S:
                # the exact-layer bounds on the depths left open, within a share of the time left
                t0 = time.perf_counter()
                until = None if self.deadline is None else t0 + RANGE_SHARE * self.left()
                rb = RangeBounds(node.sub, open_).depth_bounds(self.best_val, until, t0=bb.tau_lo)
                for P, lb in rb.items():
                    if lb > lbs[P]:
                        lbs[P] = lb
                        self.counts["raised_by_range_bounds"] += 1
                self.range_s += time.perf_counter() - t0
        for P in node.sub.depths:
            hint = node.hint if node.hint is not None and len(node.hint) == P else None
            child = Node(node.sub, P, max(node.bound, lbs.get(P, node.bound)), hint=hint)
            if P in lbs and child.bound >= self.best_val:
                child.registered = True
                self.nodes.append(child)
                self.close(child, "block bounds")
                self.counts["closed_by_block_bounds"] += 1
                continue
            self.push(child)

    def solve_node(self, node: Node, solve_kw: dict[str, Any]) -> None:
        dm = node.model
        assert dm is not None
        left = self.left()
        limit = None
        if math.isfinite(left):
            share = FIRST_SLICE if math.isfinite(self.best_val) else COLD_SLICE  # no incumbent yet: find one
            limit = min(left, max(MIN_SLICE_S, share * left) * 2**node.tries)
        start = node.last.assignment if node.last is not None and node.last.assignment else node.hint
        hint = dm.hint_arcs(start) if start is not None else None
        res = self.mod.solve_model(dm, time_limit=limit, hint=hint, **solve_kw)
        self.counts["solver_calls"] += 1
        self.max_arcs = max(self.max_arcs, len(dm.slot))
        node.last = res
        node.tries += 1
        if "resolution_s" in res.stats:
            self.resolution_s = max(self.resolution_s, float(res.stats["resolution_s"]))
        if res.assignment is not None:
            self.offer(node.sub, res.assignment)
        log.debug("%s %s: %s bound %.9g (%.2fs)", self.solver, dm.describe(), res.status, res.bound_s, res.wall_s)
        if res.status == "infeasible":
            # nothing in this depth model is at or below the cutoff it was built under
            self.counts["closed_by_solver"] += 1
            self.close(node, "solver: nothing beats the cutoff", dm.cutoff)
        elif res.status == "optimal" and dm.sub.relaxed:
            # a relaxation (mixed kinds priced by their cheapest window): its optimum is a bound only
            node.bound = max(node.bound, res.bound_s)
            self.relaxed.append(node)
        elif res.status == "optimal":
            self.counts["closed_by_solver"] += 1
            self.tolerance_s = max(self.tolerance_s, float(self.mod.tolerance(dm, res)))
            self.close(node, "solver: optimal", res.bound_s)
        else:
            node.bound = max(node.bound, res.bound_s)
            self.push(node)


def _cold_key(node: Node) -> tuple[bool, float]:
    """Which cold depth model to solve first: a small one (:data:`SMALL_ARCS`) before a large one, then the
    smallest bound."""
    assert node.model is not None
    return len(node.model.slot) > SMALL_ARCS, node.bound


__all__ = ["COLD_MODELS", "COLD_SMALL", "SMALL_ARCS", "Node", "Search"]
