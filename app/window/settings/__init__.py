"""The app's settings: what is kept in ``settings.json`` (app_settings.py), the Settings
dialog and its chat form, and what Settings → OK changes (settings_flow.py)."""
