"""The Ray engine: a placement group and one actor per task, its output streamed back."""
