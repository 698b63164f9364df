"""Finding things: the two search legs, their fusion, time phrases, and what recall puts into a
prompt."""
