"""HF model directories against PaddleNLP and PaddleFormers: their configs translated (config),
the directories read and written (directory), the two libraries' classes found (classes), and a
verification of two directories set up as a port spec (pair)."""
