"""Stage 2, collaborative dialogue: the Director's directives, episodes, group pairs and rewards."""
