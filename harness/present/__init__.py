"""The present stage: the terminal summary (show), the Markdown/HTML report and its
charts, `compare`'s and `picks`' output, and `ab`'s."""
