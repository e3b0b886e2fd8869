from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from memory_app.models import Context, Run


@login_required
def index(request):
    contexts = Context.objects.order_by("-last_activity_at", "-id")[:50]
    return render(request, "memory_app/home.html", {"contexts": contexts, "run_total": Run.objects.count()})
