"""Build envs/data/searchqa_offline.jsonl: the searchqa env's offline multi-hop set.

A small invented world (three provinces: Harrowmere, Veldmark, Ostrand) written for this
project. Each question needs two paragraphs (a bridge or a comparison); its context is
those two plus eight distractors chosen from the other paragraphs the way HotpotQA chose
its own (the paragraphs that best match the question, here by BM25), then shuffled.
Deterministic: run it twice, get the same file.
"""

import json
import random
import sys
from pathlib import Path

from envs.retrieval import BM25Retriever, Passage

ROOT = Path(__file__).resolve().parents[1]  # the script lives in scripts/

PARAGRAPHS = {
    "Cobbleford": [
        "Cobbleford is a market town on the northern shore of Lake Ives in the province of Harrowmere.",
        "It has held a wool fair every spring since 1712.",
        "The town's population was 14,200 at the last census."],
    "Saltmarrow": [
        "Saltmarrow is a fishing port on the western coast of Harrowmere.",
        "Its harbour was rebuilt after the great storm of 1881.",
        "Saltmarrow is the home port of the research vessel Gull's Reckoning."],
    "Dunhallow": [
        "Dunhallow is a hill town in the province of Veldmark, built around a ruined keep.",
        "The town stands 640 metres above sea level.",
        "Every November it hosts the Lantern Walk, a night procession through its old streets."],
    "Pellmouth": [
        "Pellmouth is a port town at the mouth of the Pell River in the province of Harrowmere.",
        "It was founded in 1450 by salt traders.",
        "Pellmouth is home to the Pellmouth College of Navigation, which trains ship pilots."],
    "Amberlee": [
        "Amberlee is a village in the Greywold Hills of Veldmark.",
        "It is known for its slate quarries, which supplied the roofs of most of the province.",
        "The poet Orrin Vask spent the last twenty years of his life in Amberlee."],
    "Kestrel Reach": [
        "Kestrel Reach is a coastal town in the province of Ostrand.",
        "It grew around a naval shipyard that opened in 1798.",
        "The town's clock tower was designed by the architect Ilse Marrow."],
    "Thornwick": [
        "Thornwick is the capital of the province of Ostrand.",
        "The city lies on both banks of the Sable River.",
        "Thornwick is the seat of the Ostrand Assembly and of the Hallow Conservatory."],
    "Wenlow": [
        "Wenlow is a small town in Harrowmere famous for its cider orchards.",
        "The composer Teodor Halvane was born in Wenlow in 1834.",
        "Its annual cider market draws traders from all three provinces."],
    "Fennick": [
        "Fennick is a mining town in the east of Veldmark.",
        "Copper was discovered there in 1767, and the last mine closed in 1954.",
        "The Fennick Mining Museum occupies the old pithead buildings."],
    "Greywold Hills": [
        "The Greywold Hills are a range of low mountains in Veldmark.",
        "Their highest summit, Cairn Aldo, reaches 1,318 metres.",
        "The Pell River rises on their southern slopes."],
    "Pell River": [
        "The Pell River is the longest river in Harrowmere.",
        "It rises in the Greywold Hills and flows 212 kilometres to the sea at Pellmouth.",
        "On its way it passes through Lake Ives."],
    "Sable River": [
        "The Sable River flows 165 kilometres through the province of Ostrand.",
        "It rises at Lake Morrow and reaches the sea at Kestrel Reach.",
        "The Sable River Viaduct carries the Ostrand railway over its gorge."],
    "Lake Ives": [
        "Lake Ives is the largest lake in Harrowmere, covering 96 square kilometres.",
        "Its deepest point is 112 metres below the surface.",
        "The lake is crossed each summer by the paddle steamer Marigold."],
    "Lake Morrow": [
        "Lake Morrow is a mountain lake in northern Ostrand.",
        "It covers 38 square kilometres and is the source of the Sable River.",
        "Its eastern shore is a nature reserve for the grey heron."],
    "Mira Thessaly": [
        "Mira Thessaly (1802–1879) was an architect from Harrowmere.",
        "She was born in Cobbleford and trained in the workshop of her uncle, a stonemason.",
        "Her best-known work is the Orlen Lighthouse."],
    "Orlen Lighthouse": [
        "The Orlen Lighthouse stands on Cape Orlen at the southern tip of Harrowmere.",
        "It was completed in 1838 to a design by Mira Thessaly.",
        "Its light can be seen from 34 kilometres out to sea."],
    "Ilse Marrow": [
        "Ilse Marrow (1861–1940) was an architect known for public clocks and towers.",
        "She was born in Dunhallow and studied at the Brannock Institute.",
        "She designed the clock tower of Kestrel Reach in 1897."],
    "Brannock Institute": [
        "The Brannock Institute is a school of engineering and architecture in Thornwick.",
        "It was founded in 1846 by the industrialist Cyrus Brannock.",
        "Its motto is \"Measure twice\"."],
    "Teodor Halvane": [
        "Teodor Halvane (1834–1902) was a composer and organist.",
        "He was born in Wenlow and taught composition at the Hallow Conservatory for thirty years.",
        "His opera The Glass Orchard is still performed in Ostrand."],
    "The Glass Orchard": [
        "The Glass Orchard is an opera in three acts by Teodor Halvane.",
        "It premiered in 1871 at the Thornwick Opera House.",
        "The libretto was written by the novelist Nessa Quill."],
    "Hallow Conservatory": [
        "The Hallow Conservatory is a music school in Thornwick.",
        "It was founded in 1822 by the singer Agathe Hallow.",
        "The conservatory's concert hall seats 900 people."],
    "Thornwick Opera House": [
        "The Thornwick Opera House opened in 1859 on Assembly Square.",
        "It was the first building in Ostrand lit by electric light, in 1888.",
        "The premiere of The Glass Orchard took place there in 1871."],
    "Nessa Quill": [
        "Nessa Quill (1840–1911) was a novelist and librettist.",
        "She was born in Dunhallow, the daughter of a clockmaker.",
        "Her first novel, The Tin Cartographer, was published in 1866."],
    "Orrin Vask": [
        "Orrin Vask (1790–1861) was a poet.",
        "He was born in Saltmarrow, the son of a net-maker.",
        "His collection Songs of the Low Tide made him famous in 1824."],
    "Gull's Reckoning": [
        "Gull's Reckoning is a research vessel launched in 1902.",
        "She was built at the naval shipyard of Kestrel Reach.",
        "On her first voyage she was commanded by Captain Edda Rusk."],
    "Edda Rusk": [
        "Edda Rusk (1866–1931) was a sea captain and explorer.",
        "She was born in Pellmouth and graduated from the Pellmouth College of Navigation in 1887.",
        "She charted the Shoals of Merrin in 1905."],
    "Pellmouth College of Navigation": [
        "The Pellmouth College of Navigation was founded in 1803.",
        "It trains ship pilots and harbour masters for the whole coast.",
        "Its first principal was Admiral Joss Ferrant."],
    "Shoals of Merrin": [
        "The Shoals of Merrin are a band of sandbanks off the coast of Ostrand.",
        "They were first charted in 1905 by Edda Rusk.",
        "More than forty shipwrecks lie on the shoals."],
    "Selka Brandt": [
        "Selka Brandt (1851–1923) was a civil engineer.",
        "She was born in Thornwick and designed the Sable River Viaduct.",
        "She later served as chief engineer of the Ostrand railway."],
    "Sable River Viaduct": [
        "The Sable River Viaduct is a stone railway bridge in Ostrand.",
        "It was designed by Selka Brandt and opened in 1889.",
        "Its longest arch spans 54 metres."],
    "Lantern Walk": [
        "The Lantern Walk is a night procession held in Dunhallow every November.",
        "It commemorates the townspeople who guarded the keep during the siege of 1642.",
        "About 3,000 people carry paper lanterns in the procession."],
    "Marigold (paddle steamer)": [
        "The Marigold is a paddle steamer that carries passengers across Lake Ives.",
        "She was built in 1912 and restored in 1988.",
        "She sails from Cobbleford each summer."],
    "Agathe Hallow": [
        "Agathe Hallow (1780–1851) was a soprano.",
        "She was born in Fennick and sang at courts across the continent.",
        "She used her fortune to found the Hallow Conservatory."],
    "Cyrus Brannock": [
        "Cyrus Brannock (1799–1870) was an industrialist who made his fortune in copper.",
        "He owned the largest mines of Fennick.",
        "He founded the Brannock Institute in 1846."],
    "Lorne Abernath": [
        "Lorne Abernath (1855–1920) was a painter of seascapes.",
        "He was born in Kestrel Reach and studied under Ansel Dray.",
        "His painting Harbour at Dusk hangs in the Thornwick Gallery."],
    "Harbour at Dusk": [
        "Harbour at Dusk is an oil painting by Lorne Abernath, finished in 1883.",
        "It shows the fishing fleet of Saltmarrow returning at sunset.",
        "The painting was bought by the Thornwick Gallery in 1901."],
    "Thornwick Gallery": [
        "The Thornwick Gallery is an art museum on Assembly Square in Thornwick.",
        "It opened in 1874 in a former grain exchange.",
        "Its collection includes more than 6,000 paintings."],
    "Ansel Dray": [
        "Ansel Dray (1820–1889) was a landscape painter and teacher.",
        "He was born in Amberlee and ran a painting school in Thornwick.",
        "His pupils included Lorne Abernath."],
    "Hendrik Oyle": [
        "Hendrik Oyle (1812–1888) was a botanist.",
        "He was born in Saltmarrow and spent eleven years collecting plants in the Greywold Hills.",
        "He gave the ember lily its scientific name."],
    "Ember lily": [
        "The ember lily is a flowering plant with orange petals that grows on rocky slopes.",
        "It was named by the botanist Hendrik Oyle in 1849.",
        "The ember lily is the emblem of the province of Veldmark."],
    "Marrowcake": [
        "Marrowcake is a baked pudding of oats, honey and dried apples.",
        "It originated in Saltmarrow in the eighteenth century.",
        "It is traditionally eaten on the first day of the wool fair in Cobbleford."],
    "Saltmarrow Rovers": [
        "Saltmarrow Rovers is a football club based in Saltmarrow.",
        "It was founded in 1893 and plays its home games at Tidegate Park.",
        "The club has won the Harrowmere Cup seven times."],
    "Tidegate Park": [
        "Tidegate Park is a football stadium on the harbour front of Saltmarrow.",
        "It opened in 1921 and holds 11,500 spectators.",
        "It replaced an older ground that was flooded in 1919."],
    "Thornwick Athletic": [
        "Thornwick Athletic is a football club from Thornwick.",
        "It was founded in 1887 by workers of the Ostrand railway.",
        "Its home ground is the Riverside Ground on the Sable River."],
    "The Tin Cartographer": [
        "The Tin Cartographer is a novel by Nessa Quill, published in 1866.",
        "It follows a clockwork mapmaker who walks from Dunhallow to the sea.",
        "It was adapted for the stage in 1902."],
    "Ostrand Assembly": [
        "The Ostrand Assembly is the elected council of the province of Ostrand.",
        "It has 61 members and meets in Thornwick.",
        "Its first session was held in 1851."],
    "Joss Ferrant": [
        "Joss Ferrant (1760–1838) was an admiral of the Ostrand fleet.",
        "After retiring from the sea he became the first principal of the Pellmouth College of Navigation.",
        "He was born in Kestrel Reach."],
    # Paragraphs no question needs: they are there to distract.
    "Cape Orlen": [
        "Cape Orlen is a rocky headland at the southern tip of Harrowmere.",
        "Its cliffs are home to a large colony of puffins.",
        "A coastal path runs from the cape to Saltmarrow."],
    "Marrow Bay": [
        "Marrow Bay is a sheltered inlet north of Saltmarrow.",
        "Oyster beds were laid there in 1840.",
        "The bay freezes over in the coldest winters."],
    "Assembly Square": [
        "Assembly Square is the main square of Thornwick.",
        "It is lined by the Ostrand Assembly building, the Thornwick Opera House and the Thornwick Gallery.",
        "A market is held there every Saturday."],
    "Riverside Ground": [
        "The Riverside Ground is a football ground in Thornwick on the Sable River.",
        "It opened in 1890 and holds 8,000 spectators.",
        "It is the home of Thornwick Athletic."],
    "Harrowmere": [
        "Harrowmere is the westernmost of the three provinces.",
        "Its capital is Pellmouth.",
        "Wool, cider and fishing are its traditional trades."],
    "Veldmark": [
        "Veldmark is an upland province covering the Greywold Hills.",
        "Its capital is Dunhallow.",
        "Its emblem is the ember lily."],
    "Ostrand": [
        "Ostrand is the eastern province, with Thornwick as its capital.",
        "Its coast is guarded by the Shoals of Merrin.",
        "The Ostrand railway links its towns to Thornwick."],
    "Ostrand railway": [
        "The Ostrand railway opened its first line in 1861.",
        "Its main line runs from Thornwick to Kestrel Reach.",
        "Selka Brandt was its chief engineer from 1895 to 1915."],
    "Songs of the Low Tide": [
        "Songs of the Low Tide is a collection of poems by Orrin Vask, published in 1824.",
        "Its forty poems describe the life of fishing families.",
        "The collection was illustrated by Ansel Dray in its 1850 edition."],
    "Fennick Mining Museum": [
        "The Fennick Mining Museum opened in 1961.",
        "It occupies the pithead buildings of the last copper mine in Fennick.",
        "Visitors can descend 90 metres into an old shaft."],
    "Cairn Aldo": [
        "Cairn Aldo is the highest summit of the Greywold Hills.",
        "A stone cairn on its top was built by shepherds.",
        "The first recorded ascent was in 1791."],
    "Wenlow cider market": [
        "The Wenlow cider market is held every October.",
        "It began in 1766 as a fair for orchard workers.",
        "Prizes are given for the best dry and sweet ciders."],
    "Gull Island": [
        "Gull Island is a small uninhabited island off Saltmarrow.",
        "It was a quarantine station from 1830 to 1890.",
        "Its lighthouse was automated in 1962."],
    "Merrin Light": [
        "Merrin Light is a lightship that marks the northern edge of the Shoals of Merrin.",
        "The present vessel was placed there in 1930.",
        "It is painted red with its name in white letters."],
    "Halvane Quartet": [
        "The Halvane Quartet is a string quartet founded in Thornwick in 1950.",
        "It is named after the composer Teodor Halvane.",
        "The quartet has recorded all of his chamber music."],
    "Brandt Bridge": [
        "The Brandt Bridge is an iron footbridge in Thornwick.",
        "It was named in honour of the engineer Selka Brandt after her death.",
        "It crosses the Sable River near the Riverside Ground."],
    "Quill Prize": [
        "The Quill Prize is a literary award for a first novel, named after Nessa Quill.",
        "It was first awarded in 1925.",
        "The winner receives a silver pen."],
    "Ives Rowing Club": [
        "The Ives Rowing Club was founded in Cobbleford in 1868.",
        "Its crews train on Lake Ives.",
        "The club holds a regatta every July."],
    "Dunhallow Keep": [
        "Dunhallow Keep is a ruined castle at the centre of Dunhallow.",
        "It was besieged for five months in 1642.",
        "Only its north tower still stands."],
    "Morrow Heron Reserve": [
        "The Morrow Heron Reserve protects the eastern shore of Lake Morrow.",
        "It was established in 1972.",
        "About 400 pairs of grey herons nest there."],
    "Amberlee slate quarries": [
        "The Amberlee slate quarries were worked from 1700 to 1965.",
        "At their peak they employed 1,200 quarrymen.",
        "The largest pit is now a flooded lake used by divers."],
    "Kestrel Reach shipyard": [
        "The Kestrel Reach shipyard built warships and, later, research vessels.",
        "Its largest dry dock was added in 1870.",
        "The yard closed in 1968 and is now a maritime museum."],
}

# (question, answer, type, level, [(title, sent_id), (title, sent_id)]): the first
# supporting title is the one the question names, the second the bridge (or the other
# side of a comparison).
QUESTIONS = [
    ("In which town was the architect of the Orlen Lighthouse born?", "Cobbleford", "bridge", "easy",
     [("Orlen Lighthouse", 1), ("Mira Thessaly", 1)]),
    ("The architect of the clock tower of Kestrel Reach was born in which town?", "Dunhallow", "bridge", "easy",
     [("Kestrel Reach", 2), ("Ilse Marrow", 1)]),
    ("How high above sea level is the birthplace of Ilse Marrow?", "640 metres", "bridge", "medium",
     [("Ilse Marrow", 1), ("Dunhallow", 1)]),
    ("Who founded the school where Ilse Marrow studied?", "Cyrus Brannock", "bridge", "medium",
     [("Ilse Marrow", 1), ("Brannock Institute", 1)]),
    ("In which year was the music school where Teodor Halvane taught founded?", "1822", "bridge", "medium",
     [("Teodor Halvane", 1), ("Hallow Conservatory", 1)]),
    ("The composer of The Glass Orchard was born in which town?", "Wenlow", "bridge", "easy",
     [("The Glass Orchard", 0), ("Teodor Halvane", 1)]),
    ("Who wrote the libretto of the opera that premiered at the Thornwick Opera House in 1871?", "Nessa Quill",
     "bridge", "medium", [("Thornwick Opera House", 2), ("The Glass Orchard", 2)]),
    ("In which year was the first novel of the librettist of The Glass Orchard published?", "1866", "bridge",
     "hard", [("The Glass Orchard", 2), ("Nessa Quill", 2)]),
    ("Were Nessa Quill and Teodor Halvane born in the same town?", "no", "comparison", "medium",
     [("Nessa Quill", 1), ("Teodor Halvane", 1)]),
    ("The poet who spent his last twenty years in Amberlee was born in which town?", "Saltmarrow", "bridge",
     "medium", [("Amberlee", 2), ("Orrin Vask", 1)]),
    ("Who was born first, Orrin Vask or Mira Thessaly?", "Orrin Vask", "comparison", "easy",
     [("Orrin Vask", 0), ("Mira Thessaly", 0)]),
    ("Who commanded the research vessel whose home port is Saltmarrow on her first voyage?", "Edda Rusk",
     "bridge", "medium", [("Saltmarrow", 2), ("Gull's Reckoning", 2)]),
    ("In which town was the captain of the first voyage of Gull's Reckoning born?", "Pellmouth", "bridge",
     "medium", [("Gull's Reckoning", 2), ("Edda Rusk", 1)]),
    ("In which year did the shipyard that built Gull's Reckoning open?", "1798", "bridge", "hard",
     [("Gull's Reckoning", 1), ("Kestrel Reach", 1)]),
    ("Who was the first principal of the college from which Edda Rusk graduated?", "Joss Ferrant", "bridge",
     "medium", [("Edda Rusk", 1), ("Pellmouth College of Navigation", 2)]),
    ("The explorer who first charted the Shoals of Merrin graduated in which year?", "1887", "bridge",
     "medium", [("Shoals of Merrin", 1), ("Edda Rusk", 1)]),
    ("How long is the river crossed by the viaduct that Selka Brandt designed?", "165 kilometres", "bridge",
     "hard", [("Selka Brandt", 1), ("Sable River", 0)]),
    ("How long is the longest arch of the bridge designed by Selka Brandt?", "54 metres", "bridge", "medium",
     [("Selka Brandt", 1), ("Sable River Viaduct", 2)]),
    ("Which is longer, the Pell River or the Sable River?", "Pell River", "comparison", "medium",
     [("Pell River", 1), ("Sable River", 0)]),
    ("The Lantern Walk is held in a town in which province?", "Veldmark", "bridge", "easy",
     [("Lantern Walk", 0), ("Dunhallow", 0)]),
    ("How deep is the lake crossed by the paddle steamer Marigold at its deepest point?", "112 metres",
     "bridge", "medium", [("Marigold (paddle steamer)", 0), ("Lake Ives", 1)]),
    ("Through which lake does the river that reaches the sea at Pellmouth pass?", "Lake Ives", "bridge",
     "medium", [("Pellmouth", 0), ("Pell River", 2)]),
    ("What is the highest summit of the hills where the Pell River rises?", "Cairn Aldo", "bridge", "medium",
     [("Pell River", 1), ("Greywold Hills", 1)]),
    ("What area does the lake at the source of the Sable River cover?", "38 square kilometres", "bridge",
     "medium", [("Sable River", 1), ("Lake Morrow", 1)]),
    ("In which town was the founder of the Hallow Conservatory born?", "Fennick", "bridge", "easy",
     [("Hallow Conservatory", 1), ("Agathe Hallow", 1)]),
    ("In which year was copper discovered in the birthplace of Agathe Hallow?", "1767", "bridge", "hard",
     [("Agathe Hallow", 1), ("Fennick", 1)]),
    ("Which was founded earlier, the Hallow Conservatory or the Brannock Institute?", "Hallow Conservatory",
     "comparison", "medium", [("Hallow Conservatory", 1), ("Brannock Institute", 1)]),
    ("In which town was the painter of Harbour at Dusk born?", "Kestrel Reach", "bridge", "easy",
     [("Harbour at Dusk", 0), ("Lorne Abernath", 1)]),
    ("In which year did the museum that bought Harbour at Dusk open?", "1874", "bridge", "medium",
     [("Harbour at Dusk", 2), ("Thornwick Gallery", 1)]),
    ("Harbour at Dusk shows the fishing fleet of a port whose harbour was rebuilt after a storm in which year?",
     "1881", "bridge", "hard", [("Harbour at Dusk", 1), ("Saltmarrow", 1)]),
    ("In which village was the teacher of Lorne Abernath born?", "Amberlee", "bridge", "medium",
     [("Lorne Abernath", 1), ("Ansel Dray", 1)]),
    ("Was Lorne Abernath born before Ansel Dray?", "no", "comparison", "easy",
     [("Lorne Abernath", 0), ("Ansel Dray", 0)]),
    ("The ember lily was named by a botanist born in which town?", "Saltmarrow", "bridge", "easy",
     [("Ember lily", 1), ("Hendrik Oyle", 1)]),
    ("Were Hendrik Oyle and Orrin Vask born in the same town?", "yes", "comparison", "medium",
     [("Hendrik Oyle", 1), ("Orrin Vask", 1)]),
    ("Marrowcake is traditionally eaten at a fair that has been held since which year?", "1712", "bridge",
     "hard", [("Marrowcake", 2), ("Cobbleford", 1)]),
    ("How many spectators does the home ground of Saltmarrow Rovers hold?", "11,500", "bridge", "medium",
     [("Saltmarrow Rovers", 1), ("Tidegate Park", 1)]),
    ("Which was founded first, Saltmarrow Rovers or Thornwick Athletic?", "Thornwick Athletic", "comparison",
     "medium", [("Saltmarrow Rovers", 1), ("Thornwick Athletic", 1)]),
    ("The author of The Tin Cartographer was the daughter of a man of which trade?", "clockmaker", "bridge",
     "medium", [("The Tin Cartographer", 0), ("Nessa Quill", 1)]),
    ("The Ostrand Assembly meets in a city on the banks of which river?", "Sable River", "bridge", "medium",
     [("Ostrand Assembly", 1), ("Thornwick", 1)]),
    ("Which is larger in area, Lake Ives or Lake Morrow?", "Lake Ives", "comparison", "medium",
     [("Lake Ives", 0), ("Lake Morrow", 1)]),
    ("In which town was the first principal of the Pellmouth College of Navigation born?", "Kestrel Reach",
     "bridge", "medium", [("Pellmouth College of Navigation", 2), ("Joss Ferrant", 2)]),
    ("Is the Orlen Lighthouse older than the Sable River Viaduct?", "yes", "comparison", "easy",
     [("Orlen Lighthouse", 1), ("Sable River Viaduct", 1)]),
    ("Did the Thornwick Gallery open before the Thornwick Opera House?", "no", "comparison", "medium",
     [("Thornwick Gallery", 1), ("Thornwick Opera House", 0)]),
]

NUM_DISTRACTORS = 8


def build_rows() -> list[dict]:
    titles = list(PARAGRAPHS)
    pool = BM25Retriever([Passage(t, " ".join(PARAGRAPHS[t])) for t in titles])
    rows = []
    for number, (question, answer, qtype, level, facts) in enumerate(QUESTIONS, start=1):
        gold = [title for title, _ in facts]
        for title, sent_id in facts:
            assert title in PARAGRAPHS and sent_id < len(PARAGRAPHS[title]), (number, title, sent_id)
        if answer not in ("yes", "no"):
            evidence = " ".join(PARAGRAPHS[t][s] for t, s in facts)
            # a comparison's answer is one of the two names the question gives
            assert answer in evidence or (qtype == "comparison" and answer in question), (number, answer)
        # HotpotQA's distractors are the paragraphs that best match the question.
        ranked = pool.search(question, k=len(titles))
        distractors = [p.title for p in ranked if p.title not in gold][:NUM_DISTRACTORS]
        rng = random.Random(number)
        rest = [t for t in titles if t not in gold and t not in distractors]
        distractors += rng.sample(rest, NUM_DISTRACTORS - len(distractors))
        context_titles = gold + distractors
        rng.shuffle(context_titles)
        rows.append({
            "id": f"searchqa-offline-{number:03d}",
            "question": question,
            "answer": answer,
            "type": qtype,
            "level": level,
            "supporting_facts": {"title": gold, "sent_id": [s for _, s in facts]},
            "context": {"title": context_titles, "sentences": [PARAGRAPHS[t] for t in context_titles]},
        })
    return rows


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "envs" / "data" / "searchqa_offline.jsonl"
    rows = build_rows()
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} questions, {len(PARAGRAPHS)} paragraphs → {out}")


if __name__ == "__main__":
    main()
