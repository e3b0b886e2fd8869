"""Login and logout for the dashboard (Django auth; no self-service password reset by e-mail)."""

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required

login = auth_views.LoginView.as_view(redirect_authenticated_user=True)
# Logging out is a POST (CSRF-protected); an anonymous visitor is sent to the login page.
logout = login_required(auth_views.LogoutView.as_view())
