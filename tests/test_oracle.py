from fedrepro.data.oracle import greedy_oracle, oracle_labels


def test_oracle_picks_the_sentences_that_cover_the_reference():
    sents = [
        "The weather was mild on Tuesday.",
        "The council approved the new school budget.",
        "Officials said the budget adds ten teachers.",
        "A cat slept on the wall.",
    ]
    ref = "The council approved a school budget that adds ten teachers."
    assert greedy_oracle(sents, ref, 3) == [1, 2]  # stops when no sentence improves ROUGE-1+2
    assert oracle_labels(sents, ref, 3) == [0, 1, 1, 0]
    assert greedy_oracle(sents, ref, 1) == [1]


def test_oracle_on_no_overlap_selects_nothing():
    assert greedy_oracle(["alpha beta", "gamma"], "delta epsilon", 3) == []
