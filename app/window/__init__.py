"""The desktop window (PySide6): a thin view over ``app.session``.

``shell/gui.run`` starts it; ``shell/main_window.MainWindow`` assembles the widgets (the
subfolders are the rooms: shell, transcript, tree, flows, workers, settings). Everything here
runs on the Qt UI thread and never waits on the engine: requests go to the engine
process through ``workers/engine_client.EngineClient`` and come back as signals.
"""
