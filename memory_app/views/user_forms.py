"""The dashboard's inputs for managing users (admins only)."""

from __future__ import annotations

from django import forms

from memory_app.services.users import ROLES
from memory_app.views.forms import DashboardForm

ROLE_CHOICES = [(role, role) for role in ROLES]


class UserCreateForm(DashboardForm):
    username = forms.CharField(max_length=150)
    password = forms.CharField(max_length=200, strip=False)
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class UserRoleForm(DashboardForm):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class UserActiveForm(DashboardForm):
    active = forms.TypedChoiceField(choices=[("1", "1"), ("0", "0")], coerce=lambda v: v == "1")


class UserPasswordForm(DashboardForm):
    password = forms.CharField(max_length=200, strip=False)
