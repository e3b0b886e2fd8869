"""Login and logout for the dashboard (Django auth; no self-service password reset by e-mail)."""

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required

# The form and its post; FormView would also take PUT as a post.
login = auth_views.LoginView.as_view(
    redirect_authenticated_user=True, http_method_names=["get", "post"]
)
# Logging out is a POST (CSRF-protected; LogoutView takes nothing else); an anonymous visitor is
# sent to the login page.
logout = login_required(auth_views.LogoutView.as_view())
