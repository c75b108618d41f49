"""The guess-the-ratio game: rules (pure maths), prompts, answer parsing, the player agent."""
