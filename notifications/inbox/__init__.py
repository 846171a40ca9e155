"""The in-app inbox (docs/APP.md): the ``in_app`` channel's destination, one item per notification."""
