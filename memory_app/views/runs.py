"""Run logbook: step list beside the current step, stepped through by URL (/runs/<id>/steps/<n>/)."""

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from memory_app import dashboard_queries as dq
from memory_app.logbook import Actor, steps_set_pruned
from memory_app.models import Run, Step
from memory_app.roles import require
from memory_app.views.common import render_page, wants_fragment


def _run(run_id: int) -> Run:
    return get_object_or_404(
        Run.objects.select_related("context").defer("system_prompt"), pk=run_id
    )


@require("view")
def run_start(request, run_id: int):
    run = _run(run_id)
    if run.last_position == 0:
        return render_page(request, "memory_app/run.html", {"run": run, "step": None})
    return redirect("run-step", run_id=run.pk, position=1)


@require("view")
def run_step(request, run_id: int, position: int):
    run = _run(run_id)
    step = dq.step_detail(run=run, position=position)
    if step is None:
        raise Http404(f"run {run.pk} has no step {position}")
    context = {
        "run": run,
        "step": step,
        "nav": dq.step_nav(run=run, position=position),
        "window": dq.step_window(run=run, position=position),
        "timeline": dq.run_timeline(run=run, position=position),
    }
    return render_page(request, "memory_app/run.html", context, fragment="logbook")


@require("view")
def step_model_input(request, run_id: int, position: int):
    run = _run(run_id)
    if not Step.objects.filter(run=run, position=position).exists():
        raise Http404(f"run {run.pk} has no step {position}")
    messages = dq.step_model_input(run=run, position=position) or []
    context = {"run": run, "position": position, "model_input": messages}
    return render_page(request, "memory_app/step_extra.html", context, fragment="model-input")


@require("view")
def step_transcript(request, run_id: int, position: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    if not Step.objects.filter(run=run, position=position).exists():
        raise Http404(f"run {run.pk} has no step {position}")
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
