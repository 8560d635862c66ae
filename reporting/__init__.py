"""What a simulation leaves behind: result files, plots and a self-contained HTML report."""
