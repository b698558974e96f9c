"""Generated samples of FedSUMM's five Chinese corpora (CSL, NLPCC2017, LCSTS, THUCNews, EDUCATION).

Each ``write_<name>_samples`` writes the committed ``resources/samples/<name>/`` in the source's raw
layout, which its own parser reads (:mod:`fedrepro.data.sources.csl`, ``nlpcc2017``, ``lcsts``,
``thucnews``, ``education``); the source registry calls it as
``fedrepro.data.sources.get(name).write_samples(out_dir)``. Regenerate them all with
``python -m fedrepro.data.samples.chinese resources/samples``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedrepro.data.samples import check_scale
from fedrepro.data.sources._chinese import NAMES
from fedrepro.data.sources.csl import CSL_PROMPT
from fedrepro.data.sources.thucnews import thucnews_split
from fedrepro.io import write_text_atomic

__all__ = [
    "SAMPLE_WRITERS",
    "main",
    "write_csl_samples",
    "write_education_samples",
    "write_lcsts_samples",
    "write_nlpcc2017_samples",
    "write_thucnews_samples",
]


# Each generator writes a small copy in the source's *raw* layout (so the real parser reads it)
# from a seeded ``random.Random`` per file: the same arguments give byte-identical files. Texts are
# built from templates whose target is composed of phrases stated in the input (a summarizer can
# learn the mapping; copying the first sentence is not enough).
Pair = tuple[str, str]


def _rng(name: str, split: str, seed: int, copy: int = 0) -> random.Random:
    """The stream of one file; copy ``k >= 1`` (the ``k``-th extra copy of a file of a sample
    written with ``scale > 1``) appends ``/scale/{k}`` to the ``scale=1`` stream's name."""
    base = f"fedrepro.chinese/{name}/{split}/{seed}"
    return random.Random(base if copy == 0 else f"{base}/scale/{copy}")


def _pick(rng: random.Random, items: Sequence[Any]) -> Any:
    return items[rng.randrange(len(items))]


_HALF_WIDTH = str.maketrans(
    {"，": ",", "。": ".", "；": ";", "：": ":", "（": "(", "）": ")", "＜": "<"}
)


def _month_day(rng: random.Random) -> tuple[int, int]:
    return rng.randint(1, 12), rng.randint(1, 28)


# -- CSL: scientific abstract -> paper title ----------------------------------------------------
_CSL_ENG = {
    "obj": (
        "永磁同步电机",
        "锂离子电池",
        "配电网",
        "无线传感器网络",
        "风力发电机组",
        "数控机床主轴",
        "光伏并网逆变器",
        "城市轨道交通车辆",
    ),
    "method": (
        "改进粒子群算法",
        "卷积神经网络",
        "模糊PID控制",
        "滑模变结构控制",
        "小波包分解",
        "长短期记忆网络",
        "自适应遗传算法",
        "扩展卡尔曼滤波",
    ),
    "task": ("故障诊断", "参数辨识", "状态估计", "优化调度", "振动抑制", "剩余寿命预测"),
    "problem": ("精度低、收敛速度慢", "实时性差", "鲁棒性不足", "计算量大、易陷入局部最优"),
    "step": (
        "建立了{obj}的数学模型",
        "分析了影响{obj}{task}的主要因素",
        "采集了{obj}运行过程中的振动与电流信号",
    ),
    "step2": ("对模型参数进行寻优", "提取特征并建立{task}模型", "实现关键参数的在线更新"),
    "valid": ("仿真实验", "现场试验", "MATLAB/Simulink仿真和样机实验"),
    "result": (
        "具有更高的准确率和更快的收敛速度",
        "有效降低了计算复杂度",
        "具有较好的鲁棒性和工程应用价值",
    ),
}
_CSL_MED = {
    "drug": ("补肾活血汤", "丹参注射液", "阿托伐他汀", "黄芪颗粒", "针刺联合艾灸", "益气活血方"),
    "disease": (
        "老年高血压",
        "2型糖尿病",
        "慢性心力衰竭",
        "急性脑梗死",
        "慢性阻塞性肺疾病",
        "膝骨关节炎",
    ),
    "outcome": ("血管内皮功能", "炎症因子水平", "血脂水平", "生活质量", "中医证候积分"),
}
_CSL_AGRI = {
    "crop": {
        "水稻": "龙粳31",
        "玉米": "郑单958",
        "冬小麦": "扬麦16",
        "马铃薯": "费乌瑞它",
        "大豆": "中黄13",
        "棉花": "鲁棉研28",
    },
    "treat": (
        ("氮肥施用量", "施氮量180 kg/hm2"),
        ("种植密度", "密度6.0万株/hm2"),
        ("灌溉定额", "灌水量2400 m3/hm2"),
        ("有机肥替代比例", "有机肥替代30%化肥"),
        ("播期", "10月15日播种"),
    ),
    "trait": ("产量及品质", "光合特性", "干物质积累", "根系形态", "氮素利用效率"),
    "region": ("黄淮海地区", "东北地区", "长江中下游地区", "西北旱作区"),
}
_CSL_ECON = {
    "subj": ("数字普惠金融", "环境规制", "产业集聚", "人口老龄化", "营商环境优化", "农村电子商务"),
    "effect": ("居民消费", "企业技术创新", "城乡收入差距", "绿色全要素生产率", "农民增收"),
    "data": (
        ("2011—2020年中国30个省份的面板数据", "省级面板数据"),
        ("2010—2019年A股上市公司数据", "上市公司数据"),
        ("中国家庭金融调查（CHFS）数据", "CHFS数据"),
    ),
    "model": ("双向固定效应模型", "中介效应模型", "空间杜宾模型", "双重差分法"),
    "channel": ("缓解融资约束", "促进人力资本积累", "推动产业结构升级", "降低交易成本"),
    "group": ("中西部地区", "东部地区", "非国有企业", "农村家庭"),
    "policy": ("进一步完善相关政策", "推动经济高质量发展", "优化区域协调发展政策"),
}


def _csl_engineering(rng: random.Random) -> Pair:
    v = {
        k: _pick(rng, _CSL_ENG[k]) for k in ("obj", "method", "task", "problem", "valid", "result")
    }
    step = _pick(rng, _CSL_ENG["step"]).format(**v)
    step2 = _pick(rng, _CSL_ENG["step2"]).format(**v)
    abstract = (
        f"针对{v['obj']}{v['task']}中存在的{v['problem']}等问题，提出了一种基于{v['method']}的"
        f"{v['obj']}{v['task']}方法。首先，{step}；然后，利用{v['method']}{step2}；最后，通过"
        f"{v['valid']}对所提方法进行了验证。结果表明，与传统方法相比，该方法{v['result']}，"
        f"{v['task']}误差降低了{rng.randint(8, 46)}.{rng.randint(0, 9)}%。"
    )
    suffix = _pick(rng, ("方法", "研究", "方法研究"))
    return abstract, f"基于{v['method']}的{v['obj']}{v['task']}{suffix}"


def _csl_medicine(rng: random.Random) -> Pair:
    drug, disease, outcome = (_pick(rng, _CSL_MED[k]) for k in ("drug", "disease", "outcome"))
    n = 2 * rng.randint(30, 60)
    e1 = rng.randint(86, 96)
    abstract = (
        f"目的 观察{drug}治疗{disease}的临床疗效及对患者{outcome}的影响。方法 将{n}例{disease}患者"
        f"按随机数字表法分为对照组和治疗组，各{n // 2}例。对照组给予常规西医治疗，治疗组在对照组"
        f"基础上加用{drug}，疗程{rng.choice((4, 8, 12))}周。比较两组治疗前后{outcome}的变化。"
        f"结果 治疗组总有效率为{e1}.{rng.randint(0, 9)}%，高于对照组的{e1 - rng.randint(10, 20)}."
        f"{rng.randint(0, 9)}%；治疗后治疗组{outcome}改善程度优于对照组，差异有统计学意义"
        f"（P＜0.05）。结论 {drug}治疗{disease}疗效确切，能够改善患者{outcome}。"
    )
    title = _pick(rng, (f"{drug}治疗{disease}的临床观察", f"{drug}对{disease}患者{outcome}的影响"))
    return abstract, title


def _csl_agriculture(rng: random.Random) -> Pair:
    crop = _pick(rng, sorted(_CSL_AGRI["crop"]))
    treat, level = _pick(rng, _CSL_AGRI["treat"])
    trait, region = _pick(rng, _CSL_AGRI["trait"]), _pick(rng, _CSL_AGRI["region"])
    y1 = rng.randint(2012, 2019)
    abstract = (
        f"为明确不同{treat}对{crop}{trait}的影响，以{crop}品种{_CSL_AGRI['crop'][crop]}为材料，于"
        f"{y1}—{y1 + 1}年在{region}开展田间试验，设置{rng.randint(4, 6)}个{treat}处理，研究了各处理下"
        f"{crop}{trait}的变化规律。结果表明：随{treat}的增加，{crop}{trait}各指标呈先升高后降低的趋势，"
        f"以{level}处理表现最优，产量较对照提高{rng.randint(6, 25)}.{rng.randint(0, 9)}%。综合考虑，"
        f"{level}为{region}{crop}生产中适宜的{treat}。"
    )
    title = _pick(
        rng, (f"不同{treat}对{crop}{trait}的影响", f"{treat}对{region}{crop}{trait}的影响")
    )
    return abstract, title


def _csl_economics(rng: random.Random) -> Pair:
    v = {
        k: _pick(rng, _CSL_ECON[k])
        for k in ("subj", "effect", "model", "channel", "group", "policy")
    }
    data, data_short = _pick(rng, _CSL_ECON["data"])
    verb = _pick(rng, ("促进", "抑制"))
    abstract = (
        f"本文利用{data}，采用{v['model']}实证检验了{v['subj']}对{v['effect']}的影响及其作用机制。"
        f"研究发现：{v['subj']}显著{verb}了{v['effect']}，在经过一系列稳健性检验后该结论依然成立；"
        f"异质性分析表明，这一影响在{v['group']}更为明显；机制检验显示，{v['subj']}主要通过"
        f"{v['channel']}作用于{v['effect']}。本文为{v['policy']}提供了经验证据。"
    )
    title = _pick(
        rng,
        (
            f"{v['subj']}对{v['effect']}的影响研究",
            f"{v['subj']}与{v['effect']}——基于{data_short}的实证分析",
        ),
    )
    return abstract, title


_CSL_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _csl_engineering,
    _csl_medicine,
    _csl_agriculture,
    _csl_economics,
)
CSL_SAMPLE_SIZES: dict[str, int] = {"train.tsv": 40, "dev.tsv": 20, "test.tsv": 20}


def write_csl_samples(out_dir: str | os.PathLike, seed: int = 0, scale: int = 1) -> dict[str, int]:
    """Write ``train.tsv``/``dev.tsv``/``test.tsv`` in CSL's raw ``to title \\t abstract \\t title``
    layout (engineering, medicine, agriculture and economics abstracts; mixed full- and half-width
    punctuation as in the real files), ``scale`` × :data:`CSL_SAMPLE_SIZES` rows each (extra copies
    appended, ids are line numbers). Returns ``{file name: rows}``."""
    scale = check_scale(scale)
    out_dir = Path(out_dir)
    for filename, n in CSL_SAMPLE_SIZES.items():
        lines = []
        for k in range(scale):
            rng = _rng("csl", filename, seed, k)
            for _ in range(n):
                abstract, title = _pick(rng, _CSL_FAMILIES)(rng)
                if rng.random() < 0.6:  # most CSL abstracts use half-width punctuation
                    abstract = abstract.translate(_HALF_WIDTH)
                lines.append(f"{CSL_PROMPT}\t{abstract}\t{title}\n")
        write_text_atomic(out_dir / filename, "".join(lines))
    return {filename: n * scale for filename, n in CSL_SAMPLE_SIZES.items()}


# -- LCSTS: Weibo post -> headline ---------------------------------------------------------------
_LCSTS_CITIES = ("北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "南京", "西安", "重庆")
_LCSTS_COMPANIES = ("小米", "华为", "阿里巴巴", "腾讯", "京东", "百度", "联想", "格力电器")


def _lcsts_rrr(rng: random.Random) -> Pair:
    m, d = _month_day(rng)
    cut = _pick(rng, ("0.5", "0.25", "1"))
    amount = rng.randint(5, 15) * 1000
    text = (
        f"中国人民银行{m}月{d}日宣布，决定自{m}月{d + 1}日起下调金融机构存款准备金率{cut}个百分点，"
        f"此次降准共计释放长期资金约{amount}亿元。分析人士认为，此举有助于缓解"
        f"{_pick(rng, ('小微企业', '实体经济', '民营企业'))}融资难题，稳定市场预期。"
    )
    return text, f"央行宣布降准{cut}个百分点 释放资金约{amount}亿元"


def _lcsts_house(rng: random.Random) -> Pair:
    city, m = _pick(rng, _LCSTS_CITIES), rng.randint(1, 12)
    verb = _pick(rng, ("上涨", "下降"))
    p, q = f"{rng.randint(1, 9)}.{rng.randint(0, 9)}", f"{rng.randint(2, 15)}.{rng.randint(0, 9)}"
    text = (
        f"国家统计局今日发布{m}月70个大中城市住宅销售价格统计数据。数据显示，{city}新建商品住宅价格"
        f"环比{verb}{p}%，同比{verb}{q}%，涨跌幅均居一线城市前列。业内人士表示，"
        f"{_pick(rng, ('调控政策效果正在逐步显现', '市场观望情绪依然较浓', '刚需入市节奏有所加快'))}。"
    )
    return text, f"{m}月{city}新房价格环比{verb}{p}%"


def _lcsts_earnings(rng: random.Random) -> Pair:
    company = _pick(rng, _LCSTS_COMPANIES)
    period = _pick(rng, ("一季度", "上半年", "前三季度", "全年"))
    profit, growth = rng.randint(20, 400), rng.randint(5, 80)
    text = (
        f"{company}昨晚发布财报，{period}实现营业收入{rng.randint(300, 3000)}亿元，同比增长"
        f"{rng.randint(3, 40)}%；净利润{profit}亿元，同比增长{growth}%。{company}表示，业绩增长主要"
        f"得益于{_pick(rng, ('海外市场的快速扩张', '高端产品销量提升', '成本控制成效显著'))}。"
    )
    return text, f"{company}{period}净利润{profit}亿 同比增长{growth}%"


def _lcsts_weather(rng: random.Random) -> Pair:
    city = _pick(rng, _LCSTS_CITIES)
    weather = _pick(rng, ("特大暴雨", "强降雪", "大范围雾霾", "强台风"))
    flights = rng.randint(80, 600)
    text = (
        f"受{weather}影响，{city}今日全市{rng.randint(20, 90)}个路段出现积水或拥堵，机场已有{flights}"
        f"个航班延误或取消。气象部门预计，未来{rng.randint(2, 4)}天{city}仍将出现"
        f"{_pick(rng, ('持续降水', '大风降温', '低能见度天气'))}，提醒市民尽量减少外出。"
    )
    return text, f"{city}遭遇{weather} {flights}个航班延误或取消"


def _lcsts_product(rng: random.Random) -> Pair:
    company = _pick(rng, _LCSTS_COMPANIES[:3] + ("魅族", "vivo", "OPPO"))
    product = _pick(rng, ("旗舰手机", "平板电脑", "智能手表", "笔记本电脑"))
    price = rng.randint(9, 59) * 100 - 1
    text = (
        f"{company}今天下午在{_pick(rng, _LCSTS_CITIES)}发布新款{product}，搭载"
        f"{_pick(rng, ('自研芯片', '2K高刷屏幕', '超长续航电池'))}，售价{price}元起。{company}相关负责人"
        f"表示，新品将于下周正式开售，首批备货量超过{rng.randint(10, 90)}万台。"
    )
    return text, f"{company}发布新款{product} 售价{price}元起"


def _lcsts_health(rng: random.Random) -> Pair:
    habit = _pick(rng, ("喝咖啡", "步行30分钟", "吃坚果", "熬夜", "久坐"))
    disease = _pick(rng, ("心脏病", "糖尿病", "抑郁症", "肝癌"))
    verb = "增加" if habit in ("熬夜", "久坐") else "降低"
    p = rng.randint(12, 45)
    text = (
        f"{_pick(rng, ('美国', '英国', '日本', '瑞典'))}一项最新研究发现，每天{habit}的人患{disease}的风险比"
        f"普通人{verb}{p}%。研究人员对{rng.randint(2, 9)}万名志愿者进行了为期{rng.randint(5, 20)}年的"
        f"跟踪调查，结果发表在最新一期医学期刊上。"
    )
    return text, f"研究称每天{habit}患{disease}风险{verb}{p}%"


def _lcsts_jobs(rng: random.Random) -> Pair:
    year = rng.randint(2014, 2016)
    n = rng.randint(700, 780)
    industry = _pick(rng, ("互联网", "金融", "教育培训", "房地产"))
    text = (
        f"教育部日前发布数据，{year}届全国高校毕业生人数将达到{n}万人，再创历史新高。调查显示，"
        f"{industry}行业对毕业生的需求最为旺盛，平均起薪约为{rng.randint(35, 80)}00元，专家建议毕业生"
        f"调整就业预期，积极到基层就业。"
    )
    return text, f"{year}届高校毕业生达{n}万人 再创新高"


_LCSTS_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _lcsts_rrr,
    _lcsts_house,
    _lcsts_earnings,
    _lcsts_weather,
    _lcsts_product,
    _lcsts_health,
    _lcsts_jobs,
)
LCSTS_SAMPLE_SIZES: dict[str, int] = {"train": 40, "val": 20, "test": 20}


def write_lcsts_samples(
    out_dir: str | os.PathLike, seed: int = 0, scale: int = 1
) -> dict[str, int]:
    """Write ``<split>.src.txt`` (Weibo-style posts, ~100 characters) and ``<split>.tgt.txt``
    (headline summaries) for train/val/test, one pair per line, ``scale`` ×
    :data:`LCSTS_SAMPLE_SIZES` pairs each (extra copies appended, ids are line numbers). Returns
    ``{split: pairs}``."""
    scale = check_scale(scale)
    out_dir = Path(out_dir)
    for split, n in LCSTS_SAMPLE_SIZES.items():
        pairs = []
        for k in range(scale):
            rng = _rng("lcsts", split, seed, k)
            pairs += [_pick(rng, _LCSTS_FAMILIES)(rng) for _ in range(n)]
        write_text_atomic(out_dir / f"{split}.src.txt", "".join(f"{t}\n" for t, _ in pairs))
        write_text_atomic(out_dir / f"{split}.tgt.txt", "".join(f"{s}\n" for _, s in pairs))
    return {split: n * scale for split, n in LCSTS_SAMPLE_SIZES.items()}


# -- NLPCC 2017: Toutiao news article -> summary ---------------------------------------------------
_NLPCC_MEDIA = ("四海网讯", "中新网", "澎湃新闻", "新京报讯", "央视新闻", "华西都市报讯")
_NLPCC_PLACES = ("河南郑州", "四川成都", "湖南长沙", "江苏苏州", "广东东莞", "浙江温州", "山东济南")
P = "<Paragraph>"


_NLPCC_BACKGROUND = (
    (
        "记者注意到,这已是今年以来当地发生的第{n}起同类事件,相关话题在社交媒体上引发大量讨论,"
        "不少网友呼吁有关部门进一步完善管理制度,加强日常监督检查。"
    ),
    (
        "据了解,相关部门近年来持续开展专项整治行动,累计排查各类隐患{n}00余处,"
        "但仍有部分问题尚未得到根本解决。"
    ),
    (
        "对此,有专家表示,应当从制度层面入手,明确各方责任,同时加强宣传引导,"
        "提高公众的参与意识,形成长效机制。本报将持续关注后续进展。"
    ),
)


def _nlpcc_background(rng: random.Random) -> str:
    return _pick(rng, _NLPCC_BACKGROUND).format(n=rng.randint(2, 9))


def _nlpcc_accident(rng: random.Random) -> Pair:
    m, d = _month_day(rng)
    place = _pick(rng, _NLPCC_PLACES)
    spot = _pick(rng, ("一化工厂", "一居民楼", "高速公路收费站附近", "一建筑工地"))
    kind = _pick(rng, ("火灾", "爆炸事故", "坍塌事故", "多车追尾事故"))
    dead, hurt = rng.randint(1, 9), rng.randint(2, 30)
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},{m}月{d}日{rng.randint(1, 23)}时许,{place}{spot}发生{kind},"
        f"事故已造成{dead}人死亡、{hurt}人受伤。{P}据现场目击者介绍,事发时现场传出巨大声响,"
        f"随后冒出浓烟,附近居民纷纷撤离。{P}事故发生后,当地消防、公安、医疗等部门迅速赶到现场"
        f"开展救援,伤者已被送往附近医院救治,其中{rng.randint(1, hurt)}人伤势较重。{P}"
        f"当地政府已成立事故调查组,目前事故原因正在进一步调查中。"
    )
    summary = (
        f"{m}月{d}日,{place}{spot}发生{kind},造成{dead}人死亡{hurt}人受伤,事故原因正在调查中。"
    )
    return article, summary


def _nlpcc_economy(rng: random.Random) -> Pair:
    region = _pick(rng, ("全国", "广东省", "浙江省", "江苏省"))
    indicator = _pick(
        rng, ("社会消费品零售总额", "规模以上工业增加值", "固定资产投资", "外贸进出口总额")
    )
    period = _pick(rng, ("一季度", "上半年", "前三季度", "1至5月"))
    g = f"{rng.randint(3, 15)}.{rng.randint(0, 9)}"
    trend = _pick(rng, ("增速比上年同期加快", "增速比上年同期有所回落", "继续保持平稳增长"))
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},记者从{region}统计部门获悉,{period}{region}{indicator}达到"
        f"{rng.randint(2, 90)}.{rng.randint(0, 9)}万亿元,同比增长{g}%,{trend}。{P}统计部门负责人介绍,"
        f"{period}以来,{_pick(rng, ('消费市场逐步回暖', '新兴产业保持较快增长', '重点项目建设加快推进'))},"
        f"为经济平稳运行提供了有力支撑。{P}专家分析认为,下一阶段仍需{_pick(rng, ('扩大有效需求', '稳定市场预期', '加大政策支持力度'))},"
        f"推动经济持续健康发展。"
    )
    summary = f"{period}{region}{indicator}同比增长{g}%,{trend}。"
    return article, summary


def _nlpcc_sports(rng: random.Random) -> Pair:
    teams = ("广州恒大", "上海上港", "北京国安", "山东鲁能", "江苏苏宁", "天津权健")
    a, b = rng.sample(teams, 2)
    s1 = rng.randint(2, 5)
    s2 = rng.randint(0, s1 - 1)
    star = _pick(rng, ("郜林", "武磊", "于大宝", "张稀哲", "杨旭", "王永珀"))
    rnd = rng.randint(3, 28)
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},北京时间昨晚,中超联赛第{rnd}轮展开角逐,{a}主场迎战{b}。{P}"
        f"上半场第{rng.randint(5, 40)}分钟,{star}接队友传中头球破门,帮助{a}取得领先。下半场{b}"
        f"一度扳平比分,但{star}随后再入一球。{P}最终{a}以{s1}比{s2}战胜{b},{star}梅开二度,"
        f"{a}积分升至联赛第{rng.randint(1, 5)}位。{P}赛后{a}主帅表示,球队的表现令人满意。"
    )
    summary = f"中超第{rnd}轮,{a}主场{s1}比{s2}战胜{b},{star}梅开二度。"
    return article, summary


def _nlpcc_policy(rng: random.Random) -> Pair:
    city = _pick(rng, ("杭州", "南京", "郑州", "长沙", "合肥", "昆明"))
    policy, rule = _pick(
        rng,
        (
            ("垃圾分类管理条例", "生活垃圾须按四类分类投放,违者最高罚款200元"),
            ("电动自行车管理办法", "电动自行车须上牌并佩戴头盔"),
            ("养犬管理规定", "市区内禁止饲养大型犬和烈性犬"),
            ("控烟条例", "室内公共场所和工作场所全面禁止吸烟"),
        ),
    )
    m = rng.randint(1, 12)
    article = (
        f"{_pick(rng, _NLPCC_MEDIA)},近日,{city}市正式公布《{city}市{policy}》,自{m}月1日起施行。{P}"
        f"根据规定,{rule}。相关部门将加强日常检查,对违规行为依法处理。{P}市民王女士表示,"
        f"新规出台后{_pick(rng, ('环境会变得更好', '出行更加安全', '生活更有秩序'))},"
        f"希望大家都能自觉遵守。{P}据了解,{city}此前已在部分区域开展试点,效果良好。"
    )
    summary = f"《{city}市{policy}》{m}月1日起施行,{rule}。"
    return article, summary


_NLPCC_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _nlpcc_accident,
    _nlpcc_economy,
    _nlpcc_sports,
    _nlpcc_policy,
)
NLPCC2017_SAMPLE_SIZES: dict[str, int] = {
    "train_with_summ.txt": 30,
    "evaluation_with_ground_truth.txt": 20,
}


def write_nlpcc2017_samples(
    out_dir: str | os.PathLike, seed: int = 0, scale: int = 1
) -> dict[str, int]:
    """Write ``train_with_summ.txt`` and ``evaluation_with_ground_truth.txt`` in the official JSON
    lines layout ``{"summarization": ..., "article": ...}`` (articles with ``<Paragraph>`` markers),
    ``scale`` × :data:`NLPCC2017_SAMPLE_SIZES` pairs each (extra copies appended, ids are line
    numbers). Returns ``{file name: pairs}``."""
    scale = check_scale(scale)
    out_dir = Path(out_dir)
    for filename, n in NLPCC2017_SAMPLE_SIZES.items():
        lines = []
        for k in range(scale):
            rng = _rng("nlpcc2017", filename, seed, k)
            for _ in range(n):
                article, summary = _pick(rng, _NLPCC_FAMILIES)(rng)
                article = f"{article}{P}{_nlpcc_background(rng)}"
                obj = {"summarization": summary, "article": article}
                lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
        write_text_atomic(out_dir / filename, "".join(lines))
    return {filename: n * scale for filename, n in NLPCC2017_SAMPLE_SIZES.items()}


# -- THUCNews: Sina news body -> title ----------------------------------------------------------
_IND = "\u3000\u3000"  # THUCNews indents every paragraph with two ideographic spaces


def _thuc_sports(rng: random.Random) -> Pair:
    teams = ("湖人", "火箭", "凯尔特人", "马刺", "热火", "魔术", "小牛", "太阳")
    a, b = rng.sample(teams, 2)
    star = _pick(rng, ("科比", "姚明", "加内特", "邓肯", "韦德", "霍华德", "诺维茨基", "纳什"))
    pts = rng.randint(25, 45)
    s1 = rng.randint(95, 120)
    s2 = s1 - rng.randint(2, 18)
    m, d = _month_day(rng)
    shots = rng.randint(16, 28)
    body = [
        (
            f"新浪体育讯　北京时间{m}月{d}日，NBA常规赛继续进行，{a}主场迎战{b}。凭借{star}的出色发挥，"
            f"{a}最终以{s1}-{s2}战胜{b}。"
        ),
        (
            f"{star}全场出战{rng.randint(34, 44)}分钟，{shots}投{rng.randint(8, shots - 4)}中，"
            f"砍下{pts}分{rng.randint(4, 12)}个篮板，是球队获胜的最大功臣。"
        ),
        (
            f"{b}方面，主力球员手感不佳，全队三分球{rng.randint(15, 25)}投仅{rng.randint(3, 7)}中，"
            f"末节虽一度将分差迫近，但最终未能完成逆转。"
        ),
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{star}{pts}分{a}{s1}-{s2}胜{b}"


def _thuc_finance(rng: random.Random) -> Pair:
    org = _pick(rng, ("央行", "银监会", "财政部", "证监会", "国家发改委"))
    measure = _pick(
        rng,
        (
            "加强地方融资平台贷款管理",
            "规范银行理财产品发行",
            "扩大小额贷款公司试点",
            "严格控制新增房地产贷款",
        ),
    )
    body = [
        f"新浪财经讯　{org}今日发布通知，要求各地{measure}，进一步防范金融风险。",
        (
            f"通知指出，当前{_pick(rng, ('信贷增长偏快', '部分领域风险有所积累', '市场流动性较为充裕'))}，"
            f"各地要按照稳健的原则，切实落实相关监管要求。"
        ),
        (
            f"分析人士认为，{org}此举释放出{_pick(rng, ('收紧', '规范', '审慎'))}信号，"
            f"预计对市场的影响将在未来{rng.randint(2, 6)}个月内逐步显现。"
        ),
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{org}要求各地{measure}"


def _thuc_tech(rng: random.Random) -> Pair:
    company = _pick(rng, ("诺基亚", "摩托罗拉", "联想", "中兴", "索尼爱立信", "三星"))
    product = _pick(rng, ("3G手机", "上网本", "智能手机", "触屏手机"))
    price = rng.randint(12, 49) * 100 - 1
    body = [
        (
            f"新浪科技讯　{rng.randint(1, 12)}月{rng.randint(1, 28)}日消息，{company}今天在北京发布了"
            f"一款{product}，该产品售价{price}元，将于本月底正式上市。"
        ),
        (
            f"据介绍，这款{product}采用{rng.randint(3, 4)}.{rng.randint(0, 9)}英寸触摸屏，内置"
            f"{rng.randint(3, 8)}00万像素摄像头，支持{_pick(rng, ('WiFi', 'GPS导航', '手机电视'))}功能。"
        ),
        f"业内人士分析，{company}希望借此款产品进一步提升在国内{product}市场的份额。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{company}发布{product} 售价{price}元"


def _thuc_education(rng: random.Random) -> Pair:
    prov = _pick(rng, ("北京", "江苏", "广东", "山东", "湖北", "四川"))
    year = rng.randint(2008, 2011)
    exam = _pick(rng, ("高考", "中考", "研究生入学考试"))
    what = _pick(rng, ("分数线公布", "志愿填报启动", "成绩开始查询", "报名工作启动"))
    body = [
        (
            f"新浪教育讯　记者从{prov}省教育考试院获悉，{year}年{prov}{exam}{what}，"
            f"考生可通过考试院网站或声讯电话办理相关事宜。"
        ),
        (
            f"考试院提醒，今年共有{rng.randint(20, 90)}万名考生参加{exam}，考生务必在规定时间内完成操作，"
            f"逾期将不再受理。"
        ),
        f"有关负责人表示，今年{prov}将继续加强考试安全管理，确保考试公平公正。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{year}年{prov}{exam}{what}"


def _thuc_entertainment(rng: random.Random) -> Pair:
    star = _pick(rng, ("周杰伦", "刘德华", "章子怡", "周迅", "王菲", "成龙"))
    work = _pick(rng, ("新专辑", "新片", "演唱会", "新剧"))
    city = _pick(rng, ("北京", "上海", "香港", "台北"))
    body = [
        f"新浪娱乐讯　{star}昨日现身{city}，为{work}宣传造势，现场吸引了数百名粉丝和媒体。",
        (
            f"谈及{work}，{star}表示自己投入了很多心血，"
            f"{_pick(rng, ('希望大家喜欢', '这次有不少新尝试', '拍摄过程非常辛苦'))}。"
        ),
        f"据悉，{star}的{work}将于{rng.randint(1, 12)}月正式与观众见面。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{star}现身{city}为{work}造势"


def _thuc_realestate(rng: random.Random) -> Pair:
    city = _pick(rng, ("北京", "上海", "深圳", "杭州", "天津"))
    m = rng.randint(1, 12)
    verb = _pick(rng, ("上涨", "下跌"))
    p = f"{rng.randint(1, 19)}.{rng.randint(0, 9)}"
    body = [
        (
            f"新浪房产讯　据{city}市房地产交易管理网统计，{m}月{city}新建商品住宅成交"
            f"{rng.randint(5, 20)}000余套，成交均价环比{verb}{p}%。"
        ),
        (
            f"业内人士认为，{_pick(rng, ('调控政策持续发力', '开发商加大推盘力度', '年底购房需求集中释放'))}"
            f"是成交变化的主要原因。"
        ),
        f"专家预计，未来一段时间{city}楼市仍将以平稳为主。",
    ]
    return "\n".join(f"{_IND}{p}" for p in body), f"{m}月{city}新房成交均价环比{verb}{p}%"


_THUC_FAMILIES: dict[str, Callable[[random.Random], Pair]] = {
    "体育": _thuc_sports,
    "财经": _thuc_finance,
    "科技": _thuc_tech,
    "教育": _thuc_education,
    "娱乐": _thuc_entertainment,
    "房产": _thuc_realestate,
}
# first file number of each category, as in the release (numbers run on across categories)
_THUC_BASE = {
    "体育": 0,
    "娱乐": 131604,
    "房产": 264410,
    "教育": 284454,
    "科技": 481650,
    "财经": 798977,
}
THUCNEWS_SAMPLE_SIZES: dict[str, int] = {"train": 30, "val": 20, "test": 20}


def write_thucnews_samples(
    out_dir: str | os.PathLike, seed: int = 0, scale: int = 1
) -> dict[str, int]:
    """Write ``THUCNews/<类别>/<n>.txt`` documents (title line, then U+3000-indented paragraphs) for
    six categories, choosing file numbers so that :func:`thucnews_split` gives ``scale`` ×
    :data:`THUCNEWS_SAMPLE_SIZES` documents per split. Returns ``{split: documents}``.

    Copy 0 (the ``scale=1`` sample) numbers a category's files ``base … base+19999`` from the
    category's first release number; extra copy ``k`` draws from its own stream and its own block
    ``base + 20000·k …``, so file names (and record ids) never repeat."""
    scale = check_scale(scale)
    out_dir = Path(out_dir)
    categories = list(_THUC_FAMILIES)
    for k in range(scale):
        rng = _rng("thucnews", "all", seed, k)
        want = dict(THUCNEWS_SAMPLE_SIZES)
        used: set[tuple[str, int]] = set()
        i = 0
        while any(want.values()):
            category = categories[i % len(categories)]
            number = _THUC_BASE[category] + 20000 * k + rng.randrange(20000)
            split = thucnews_split(category, str(number))
            if want[split] == 0 or (category, number) in used:
                continue
            used.add((category, number))
            want[split] -= 1
            i += 1
            body, title = _THUC_FAMILIES[category](rng)
            write_text_atomic(
                out_dir / "THUCNews" / category / f"{number}.txt", f"{title}\n{body}\n"
            )
    return {split: n * scale for split, n in THUCNEWS_SAMPLE_SIZES.items()}


# -- EDUCATION: education-industry short text -> summary (documented local format) --------------
def _edu_policy(rng: random.Random) -> Pair:
    org = _pick(rng, ("教育部", "北京市教委", "上海市教委", "广东省教育厅", "浙江省教育厅"))
    doc, goal = _pick(
        rng,
        (
            ("关于进一步减轻义务教育阶段学生作业负担的通知", "小学一二年级不布置书面家庭作业"),
            ("校外培训机构管理办法", "培训机构不得占用国家法定节假日组织学科类培训"),
            ("中小学教师减负清单", "严格控制面向教师的各类检查评比"),
            ("职业教育提质培优行动计划", "到2023年建设一批高水平职业院校"),
        ),
    )
    text = (
        f"近日，{org}印发《{doc}》，明确提出{goal}。文件要求各地各校"
        f"{_pick(rng, ('加强统筹管理', '建立监测机制', '落实主体责任'))}，"
        f"并将落实情况纳入年度督导评估。业内人士认为，这将对{_pick(rng, ('中小学生', '家长', '培训行业'))}产生深远影响。"
    )
    return text, f"{org}印发{doc.removeprefix('关于')}：{goal}"


def _edu_exam(rng: random.Random) -> Pair:
    exam = _pick(rng, ("考研", "教师资格证考试", "英语四六级考试", "公务员考试"))
    year = rng.randint(2019, 2022)
    n = rng.randint(100, 480)
    text = (
        f"{year}年{exam}报名人数公布，全国共有{n}万人报考，比上年增加{rng.randint(5, 60)}万人，"
        f"再创历史新高。分析人士指出，{_pick(rng, ('就业压力加大', '学历提升需求旺盛', '政策利好持续释放'))}"
        f"是报考人数增长的主要原因，预计竞争将更加激烈，建议考生尽早规划备考。"
    )
    return text, f"{year}年{exam}报名人数达{n}万 再创新高"


def _edu_company(rng: random.Random) -> Pair:
    company = _pick(rng, ("新东方", "好未来", "中公教育", "猿辅导", "作业帮", "网易有道"))
    action, short = _pick(
        rng,
        (
            ("完成新一轮融资，金额达{x}亿元", "完成{x}亿元融资"),
            ("发布财报，季度营收同比增长{x}%", "季度营收同比增长{x}%"),
            ("宣布进军职业教育赛道，计划投入{x}亿元", "投入{x}亿元进军职业教育"),
        ),
    )
    x = rng.randint(3, 40)
    text = (
        f"{company}日前{action.format(x=x)}。公司相关负责人表示，未来将重点布局"
        f"{_pick(rng, ('素质教育', '在线直播课程', '智能学习硬件', '成人职业培训'))}，"
        f"持续加大教研投入，为学员提供更优质的学习服务。"
    )
    return text, f"{company}{short.format(x=x)}"


def _edu_school(rng: random.Random) -> Pair:
    city = _pick(rng, ("成都", "武汉", "深圳", "苏州", "青岛", "西安"))
    n = rng.randint(10, 60)
    kind = _pick(rng, ("中小学", "公办幼儿园", "普通高中"))
    seats = rng.randint(2, 9)
    text = (
        f"记者从{city}市教育局获悉，今年{city}将新建、改扩建{kind}{n}所，新增学位{seats}万个，"
        f"以缓解{_pick(rng, ('新城区入学难', '学位供给紧张', '大班额'))}问题。目前相关项目已陆续开工，"
        f"预计将于明年秋季学期前投入使用。"
    )
    return text, f"{city}今年将新建改扩建{kind}{n}所 新增学位{seats}万个"


_EDU_FAMILIES: tuple[Callable[[random.Random], Pair], ...] = (
    _edu_policy,
    _edu_exam,
    _edu_company,
    _edu_school,
)
EDUCATION_SAMPLE_SIZES: dict[str, int] = {"train": 40, "val": 20, "test": 20}


def write_education_samples(
    out_dir: str | os.PathLike, seed: int = 0, scale: int = 1
) -> dict[str, int]:
    """Write ``train.jsonl``/``val.jsonl``/``test.jsonl`` in the local-copy format
    ``{"id", "content", "summary"}`` (education-industry news briefs), ``scale`` ×
    :data:`EDUCATION_SAMPLE_SIZES` records each. Returns ``{split: records}``.

    The ``scale=1`` ids run ``edu000000 …`` over the three splits; extra copy ``k`` of a split
    appends records whose ids continue after ``k`` times all ``scale=1`` ids."""
    scale = check_scale(scale)
    out_dir = Path(out_dir)
    total = sum(EDUCATION_SAMPLE_SIZES.values())
    offset = 0
    for split, n in EDUCATION_SAMPLE_SIZES.items():
        lines = []
        for copy in range(scale):
            rng = _rng("education", split, seed, copy)
            for k in range(n):
                content, summary = _pick(rng, _EDU_FAMILIES)(rng)
                doc_id = f"edu{copy * total + offset + k:06d}"
                obj = {"id": doc_id, "content": content, "summary": summary}
                lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
        offset += n
        write_text_atomic(out_dir / f"{split}.jsonl", "".join(lines))
    return {split: n * scale for split, n in EDUCATION_SAMPLE_SIZES.items()}


SAMPLE_WRITERS: dict[str, Callable[..., dict[str, int]]] = {
    "csl": write_csl_samples,
    "nlpcc2017": write_nlpcc2017_samples,
    "lcsts": write_lcsts_samples,
    "thucnews": write_thucnews_samples,
    "education": write_education_samples,
}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedrepro.data.samples.chinese OUT_ROOT [--seed N] [--scale N] [--only NAME ...]``:
    write the samples of the five sources to ``OUT_ROOT/<name>/``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out_root", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES))
    args = parser.parse_args(argv)
    for name in args.only:
        counts = SAMPLE_WRITERS[name](args.out_root / name, seed=args.seed, scale=args.scale)
        print(f"{name}: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
