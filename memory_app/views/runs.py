"""Run logbook: step list beside the current step, stepped through by URL (/runs/<id>/steps/<n>/).

A run still being written is followed by polling `/runs/<id>/live/` (htmx, every 2 s): the answer
appends the new steps to the list and refreshes the header, timeline and stepper out of band,
never the step the operator is reading, so their place and open details stay as they were.

Steps can be renumbered while the page is open: a step that starts earlier than steps already
written (trace ingest writes a run's task step when the root span ends, last) takes its place in
start order. The poll names the steps the page holds by id, so it notices: it then answers the
whole logbook at the same step under its new number (the URL follows), and the step's opened
details are kept (`hx-preserve`: their loads name the step by id, so they stay right).
"""

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from memory_app import dashboard_queries as dq
from memory_app.audit import Actor
from memory_app.models import Run, RunStatus, Step
from memory_app.roles import require
from memory_app.services.curation import steps_set_pruned
from memory_app.views.common import bad_request, private, render_page, wants_fragment


def _run(run_id: int) -> Run:
    return get_object_or_404(
        Run.objects.select_related("context").defer("system_prompt"), pk=run_id
    )


@require("view")
def run_start(request, run_id: int):
    run = _run(run_id)
    if run.last_position == 0:
        return render_page(request, "memory_app/run.html", _logbook_context(run, None))
    return redirect("run-step", run_id=run.pk, position=1)


def _logbook_context(run: Run, position: int | None) -> dict:
    """What the logbook partial needs at `position` (None: the run has no steps yet)."""
    if position is None:
        return {
            "run": run,
            "step": None,
            "live": run.status == RunStatus.RUNNING,
            "cost": dq.run_cost(run=run),
        }
    step = dq.step_detail(run=run, position=position)
    if step is None:
        raise Http404(f"run {run.pk} has no step {position}")
    nav = dq.step_nav(run=run, position=position)
    window = dq.step_window(run=run, position=position)
    # The poll asks for steps after the last one the page holds (a step written between
    # reading the run and its steps is already in the list).
    shown = max([nav.last, *(s.position for s in window.steps)])
    live = run.status == RunStatus.RUNNING
    return {
        "run": run,
        "step": step,
        "nav": nav,
        "window": window,
        "timeline": dq.run_timeline(run=run, position=position),
        "cost": dq.run_cost(run=run),
        "live": live,
        "shown": shown,
        # What the poll names the page's steps by (only a running run's page polls).
        "seen": {"step": step.pk, "last": _step_id(run, shown) if live else None},
        "tail": not window.has_later,
    }


def _step_id(run: Run, position: int) -> int | None:
    return Step.objects.filter(run=run, position=position).values_list("pk", flat=True).first()


@require("view")
def run_step(request, run_id: int, position: int):
    context = _logbook_context(_run(run_id), position)
    return render_page(request, "memory_app/run.html", context, fragment="logbook")


@require("view")
def run_live(request, run_id: int):
    """What changed in a run since the page saw step `after` (htmx poll; see the module doc).

    `position` is the step on screen (absent while the run had no steps: the answer is then the
    whole logbook, at step 1 once there is one); `tail=1` when the page's step list ends with the
    run's last step, so new steps belong at its end.
    """
    run = _run(run_id)
    try:
        after = dq.parse_int(request.GET.get("after"), name="after", minimum=0) or 0
        position = dq.parse_int(request.GET.get("position"), name="position", minimum=1)
        # The ids of the step on screen and of the step at `after`, when the page knows them.
        step_id = dq.parse_int(request.GET.get("step"), name="step", minimum=1)
        last_id = dq.parse_int(request.GET.get("last"), name="last", minimum=1)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    if position is not None and _renumbered(run, (position, step_id), (after, last_id)):
        # Steps moved under the page: the whole logbook, at the same step under its new number.
        moved = Step.objects.filter(run=run, pk=step_id).values_list("position", flat=True).first()
        response = render_page(
            request, "memory_app/run.html", _logbook_context(run, moved or 1), fragment="live-whole"
        )
        response["HX-Retarget"] = "#logbook"
        response["HX-Reswap"] = "outerHTML"
        response["HX-Replace-Url"] = reverse("run-step", args=[run.pk, moved or 1])
        return response
    if position is None:
        context = _logbook_context(run, 1 if run.last_position else None)
        response = render_page(request, "memory_app/run.html", context, fragment="live-whole")
        if run.last_position:
            response["HX-Replace-Url"] = reverse("run-step", args=[run.pk, 1])
        return response
    if position > run.last_position:
        raise Http404(f"run {run.pk} has no step {position}")
    fresh = dq.steps_after(run=run, after=after)
    shown = fresh.steps[-1].position if fresh.steps else after
    context = {
        "run": run,
        "fresh": fresh,
        "shown": shown,
        "seen": {"step": step_id, "last": fresh.steps[-1].pk if fresh.steps else last_id},
        "tail": request.GET.get("tail") == "1",
        "nav": dq.step_nav(run=run, position=position),
        "timeline": dq.run_timeline(run=run, position=position),
        "cost": dq.run_cost(run=run),
        # Keep polling until the page has every step of a finished run.
        "live": run.status == RunStatus.RUNNING or fresh.has_later,
    }
    return private(render(request, "memory_app/run.html#live-update", context))


def _renumbered(run: Run, *held: tuple[int, int | None]) -> bool:
    """Whether a step the page holds, as (position, id), is no longer at that position."""
    held = [(position, pk) for position, pk in held if pk is not None and position]
    if not held:
        return False
    now = dict(
        Step.objects.filter(run=run, position__in=[p for p, _ in held]).values_list("position", "pk")
    )
    return any(now.get(position) != pk for position, pk in held)


def _step_position(request, run: Run, position: int) -> int:
    """The position of the step asked for: `?step=<id>` (what a page loads its details by, so they
    stay right when steps are renumbered) wins over the URL's position."""
    step_id = dq.parse_int(request.GET.get("step"), name="step", minimum=1)
    found = Step.objects.filter(run=run, **({"pk": step_id} if step_id else {"position": position}))
    moved = found.values_list("position", flat=True).first()
    if moved is None:
        raise Http404(f"run {run.pk} has no step {step_id or position}")
    return moved


@require("view")
def step_model_input(request, run_id: int, position: int):
    run = _run(run_id)
    try:
        position = _step_position(request, run, position)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    messages = dq.step_model_input(run=run, position=position) or []
    context = {"run": run, "position": position, "model_input": messages}
    return render_page(request, "memory_app/step_extra.html", context, fragment="model-input")


@require("view")
def step_transcript(request, run_id: int, position: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    try:
        position = _step_position(request, run, position)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    messages, omitted = dq.transcript_upto(run=run, position=position)
    context = {"run": run, "position": position, "transcript": messages, "omitted": omitted}
    return render_page(request, "memory_app/step_extra.html", context, fragment="transcript")


@require("curate")
@require_POST
def step_prune(request, run_id: int, position: int):
    """Prune or restore one step (a pruned step is left out of every transcript)."""
    run = _run(run_id)
    step = get_object_or_404(Step.objects.only("id"), run=run, position=position)
    steps_set_pruned(
        run=run,
        ids=[step.pk],
        pruned=request.POST.get("pruned", "1") == "1",
        actor=Actor.for_user(request.user),
    )
    if not wants_fragment(request):
        return redirect("run-step", run_id=run.pk, position=position)
    return run_step.__wrapped__(request, run_id=run_id, position=position)
