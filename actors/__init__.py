"""The processes of an oploop host, one module or small package per role.

host · supervisor (the turn loop) · llm_caller · executor · broadcaster ·
offline_model — plus `cli`, the user's side, and `tools`, the tool catalogue.
"""
