"""`ragen2 bench`: suites of training runs compared on one footing (suite → runner → report).

    suite.py      the YAML matrix, expanded into cells, every config validated up front
    runner.py     cells one after another, resumably, each in its own process
    worker.py     the child process that trains one cell
    display.py    the live table of cells
    report.py     results.csv/json and the paper-shaped markdown table
    comparisons.py  paired comparisons of arms over seeds, budgets spent, budget warnings
    stats.py      t and bootstrap CIs, the exact sign-flip p-value (pure statistics)
    plots.py      training curves per env
    published.py  published numbers to print beside ours
"""
