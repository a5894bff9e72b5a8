"""The desktop window (PySide6): a thin view over ``app.session``.

``gui.run`` starts it; ``main_window.MainWindow`` assembles the widgets. Everything here
runs on the Qt UI thread and never waits on the engine: requests go to the engine
process through ``engine_client.EngineClient`` and come back as signals.
"""
