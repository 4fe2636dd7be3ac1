"""What is read back from a finished run: the template-collapse audit (`audit`, its report and
its verdict rules) and the curves (`plot`)."""
