"""Finding a conversation and a branch: the sidebar's list of chats and search
(sidebar.py) and the tree panel of the shown chat (tree_panel.py, laid out off the UI
thread by tree_layout.py, shaded by what the prefix store holds: tree_coverage.py)."""
