"""The paper's published result tables (CSV data), for reports to compare against."""
