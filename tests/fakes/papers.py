"""One real paper that runs through every scholarly fake: Dense Passage Retrieval (arXiv 2004.04906,
published at EMNLP 2020 as 10.18653/v1/2020.emnlp-main.550)."""

from __future__ import annotations

DPR_DOI = "10.18653/v1/2020.emnlp-main.550"


DPR_ARXIV = "2004.04906"


DPR_TITLE = "Dense Passage Retrieval for Open-Domain Question Answering"


DPR_ABSTRACT = (
    "Open-domain question answering relies on efficient passage retrieval to select candidate contexts, "
    "where traditional sparse vector space models, such as TF-IDF or BM25, are the de facto method."
)


DPR_AUTHORS = [("Vladimir", "Karpukhin"), ("Barlas", "Oguz"), ("Sewon", "Min")]
