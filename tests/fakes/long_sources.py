"""Many long sources on one question, in English and in Chinese: what a report over 20 and more sources
is written from (tests/report/test_llm_sections.py, bench/llm_sections.py). Each source holds a
dozen sentences on one of six topics, each sentence its own (a trial's number, its figures), some
that dispute or leave open, so that the extractive writer finds themes and open questions in them;
each is longer than the 900 characters the model is shown of a passage."""

from __future__ import annotations

from fedresearch.core.models import FusedResult, SearchResult
from fedresearch.federation.fusion import fuse
from fedresearch.report.writer import Part

QUESTION = "How do hybrid retrieval systems combine lexical and dense rankings?"
ZH_QUESTION = "混合检索系统如何合并关键词排序和向量排序？"

TOPICS = {
    "fusion": [
        "Reciprocal rank fusion merges the lexical and dense rankings of hybrid retrieval by summing reciprocal ranks",
        "Rank fusion needs no score calibration because it reads only where each ranking places a document",
        "A fusion constant of sixty keeps one ranking from dominating the merged list of a hybrid system",
        "Weighted rank fusion lets a hybrid system trust its dense ranking more than its lexical ranking",
    ],
    "lexical": [
        "BM25 gives the lexical ranking of hybrid retrieval from term frequency and inverse document frequency",
        "Lexical ranking finds rare names, codes and numbers that dense encoders tend to blur together",
        "The lexical ranking of BM25 needs no training and works on a new collection from the first query",
        "Stemming and stop words change the lexical ranking that a hybrid system later combines",
    ],
    "dense": [
        "Dense retrieval encodes queries and passages as vectors and ranks passages by cosine similarity",
        "A dense ranking finds passages that share the meaning of a query but not its words",
        "Dense encoders fine-tuned on one domain lose recall on another domain without further training",
        "Approximate nearest neighbour indexes give the dense ranking of a hybrid system in milliseconds",
    ],
    "reranking": [
        "Cross-encoder reranking reads the query and each candidate together after the rankings are combined",
        "Reranking the top of a combined ranking raises precision at ten more than any fusion weighting does",
        "A reranker costs a forward pass per candidate, so hybrid systems rerank only the first hundred",
        "Distilled rerankers keep most of the precision of a cross-encoder at a tenth of its cost",
    ],
    "evaluation": [
        "Hybrid retrieval evaluations report recall at one hundred and nDCG at ten for combined rankings",
        "Combining lexical and dense rankings beat either ranking alone on most BEIR collections",
        "Evaluations of hybrid systems on small test collections show wide confidence intervals",
        "Judged pools built from lexical runs undercount what dense rankings find",
    ],
    "latency": [
        "Running the lexical and dense rankings in parallel keeps hybrid retrieval latency near the slower one",
        "Caching query vectors cuts the dense half of hybrid retrieval latency for repeated questions",
        "Fusing two rankings of a thousand documents costs well under a millisecond",
        "Memory for dense vectors grows with the collection while an inverted index compresses well",
    ],
}
DISPUTES = [
    "However, whether fusion helps when one ranking is much weaker than the other remains unclear",
    "Other studies disagree about how much the dense ranking adds once queries are long",
    "Further research is needed on combining rankings for languages with few training examples",
]


def english_results(count: int = 24) -> list[SearchResult]:
    """`count` sources, topic after topic, each a dozen sentences on its topic (some disputing)."""
    results = []
    topics = list(TOPICS.items())
    for n in range(1, count + 1):
        name, sentences = topics[(n - 1) % len(topics)]
        said = []
        for round_ in range(3):
            for k, sentence in enumerate(sentences):
                said.append(
                    f"In trial {n}.{round_}.{k}, {sentence[0].lower()}{sentence[1:]} ({n + k} of {40 + round_} runs)."
                )
        if n % 4 == 0:
            said.insert(2, f"{DISPUTES[n % len(DISPUTES)]} in trial {n}.")
        results.append(_found(n, f"https://{name}{n}.example/paper", f"{name.title()} study {n}", " ".join(said)))
    return results


def _found(rank: int, href: str, title: str, body: str) -> SearchResult:
    return SearchResult(href=href, title=title, body=body, retriever="tavily", rank=rank)


def english_sources(count: int = 24) -> list[FusedResult]:
    return fuse(english_results(count))


ZH_TOPICS = {
    "融合": [
        "倒数排名融合把关键词检索和向量检索的排序按名次倒数相加合并",
        "排名融合只看名次，不需要把两种分数校准到同一尺度",
        "融合常数取六十可以防止单一排序主导合并后的结果",
    ],
    "关键词": [
        "关键词排序按词频和逆文档频率给文档打分",
        "关键词检索能找到稠密编码器容易混淆的专有名词和编号",
        "关键词排序不需要训练，新的文档集合从第一个查询起就能使用",
    ],
    "向量": [
        "向量检索把查询和段落编码成稠密向量，用余弦相似度排序",
        "向量排序能找到意思相同但用词不同的段落",
        "在一个领域微调的向量编码器换到另一个领域时召回率下降",
    ],
    "重排": [
        "交叉编码器在合并排序之后把查询和候选段落一起读入重新排序",
        "对合并排序的前列重新排序比任何融合权重都更能提高前十名的准确率",
        "重排每个候选都要计算一次，所以混合系统只重排前一百个",
    ],
}


def chinese_results(count: int = 20) -> list[SearchResult]:
    """`count` Chinese sources of about 1,000 characters each (a CJK character is about a token)."""
    results = []
    topics = list(ZH_TOPICS.items())
    for n in range(1, count + 1):
        name, sentences = topics[(n - 1) % len(topics)]
        said = [
            f"第{n}项研究的第{k + 1}次实验表明，{sentences[k % len(sentences)]}，"
            f"在{30 + k}个查询上召回率提高了{n + k}个百分点。"
            for k in range(24)
        ]
        if n % 4 == 0:
            said.insert(2, f"然而，第{n}项研究指出，当一种排序明显较弱时融合是否有帮助尚不清楚。")
        results.append(_found(n, f"https://zh{n}.example/paper", f"{name}研究{n}", "".join(said)))
    return results


def chinese_sources(count: int = 20) -> list[FusedResult]:
    return fuse(chinese_results(count))


SUB_QUESTIONS = {
    "fusion": "How does rank fusion merge lexical and dense rankings?",
    "dense": "How do dense retrievers rank passages in hybrid retrieval?",
    "reranking": "How does reranking refine a combined ranking?",
}
FOLLOW_UPS = {
    "fusion": "What constant does reciprocal rank fusion use?",
    "dense": "How do dense encoders fare on a new domain?",
    "reranking": "What does a cross-encoder reranker cost?",
}


def parts(sources: list[FusedResult], deep: bool = False) -> list[Part]:
    """A detailed report's sub-questions over `sources` (each searched: the sources of its topic
    first), with a follow-up each for deep research."""
    found = []
    for topic, question in SUB_QUESTIONS.items():
        own = [s for s in sources if s.href.startswith(f"https://{topic}")]
        children = []
        if deep:
            follow_up = FOLLOW_UPS[topic]
            children = [Part(follow_up, own[::-1] + sources[:2], focus=follow_up)]
        found.append(Part(question, own + sources[:3], focus=question, children=children))
    return found
